"""Where the sandbox agent and its runtime are staged: a directory only this user can change.

Every container runs what is staged as its pid 1 (in bind mode with the base dir mounted), so
whoever can write the staged copy chooses what runs in this user's sandboxes. Predictable names
in the shared temp dir, reused whenever a marker file existed, let any local user stage a
bundle first. So:

* **the staging root is this user's**: ``$XDG_CACHE_HOME/toolseam`` (``~/.cache/toolseam``)
  when other users can pass through to it — a rootless engine runs as its own user and must
  read the bundle, which a 0700 home (root's, on Debian) forbids — else ``<tempdir>/toolseam-<uid>``.
  Made 0711: others may pass through to a bundle whose name they know, not list or change it.
* **the path is checked before every use**: each directory on the way (symlinks resolved) is
  owned by root or this user and writable by no one else — a sticky world-writable one such as
  ``/tmp`` counts as safe, nobody can rename what is not theirs in it. A root that fails (another
  user made ``/tmp/toolseam-0`` first) is never used: this process stages in a private
  directory of its own instead, removed at exit.
* **a staged directory is reused only when verified**: it and everything in it is this user's,
  writable by no one else, plain files and directories only, and the content matches the
  manifest written when it was sealed (hashed once per process: after that only this user could
  change it). Anything else is moved aside and staged anew.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..seam.errors import ConfigurationError
from .mount_calls import mount_table

MANIFEST = "MANIFEST.sha256"  # sha256sum's format: "<hex>  <relative path>"
_ROOT_MODE = 0o711
_log = logging.getLogger("toolseam")
_verified: dict[str, tuple[int, int, int]] = {}  # staged dir -> (dev, ino, mtime_ns) when hashed
_private: list[Path] = []  # this process's own root, when the shared one was taken


class UnsafePath(Exception):
    """A directory someone else could change."""


def check_owned(path: Path, uid: int, *, exact_owner: bool) -> None:
    """``path`` (lstat: a symlink is refused) is a directory owned by ``uid`` (or root, unless
    ``exact_owner``) that no one else may write, or a sticky one. Raises UnsafePath."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is not a directory")
    if st.st_uid != uid and (exact_owner or st.st_uid != 0):
        raise UnsafePath(f"{path} belongs to uid {st.st_uid}, not to uid {uid}")
    if st.st_mode & 0o022 and (exact_owner or not st.st_mode & stat.S_ISVTX):
        raise UnsafePath(f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})")


def check_ancestors(path: Path, uid: int) -> None:
    """Every directory from ``/`` down to ``path``'s parent, as resolved, is safe."""
    for ancestor in reversed(Path(os.path.realpath(path.parent)).parents):
        check_owned(ancestor, uid, exact_owner=False)
    check_owned(Path(os.path.realpath(path.parent)), uid, exact_owner=False)


def _reachable(path: Path) -> bool:
    """Another user can pass through every directory down to ``path``."""
    real = Path(os.path.realpath(path))
    return all(os.stat(p).st_mode & 0o001 for p in (*real.parents, real) if p.exists())


def read_private_text(path: str, where: str) -> str:
    """A secret's file as text (a token file of ``toolseam mcp`` or ``toolseam metrics``): one
    only its owner — this user — can read or change, or a ``ConfigurationError`` that starts
    with ``where`` (the flag the user wrote) and says what to do.

    The checks are made on the open descriptor the text is read from (``O_NOFOLLOW``,
    ``fstat``), so a symlink to someone else's file is refused and a file swapped in between a
    check and the read is never the one read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigurationError(f"{where}: is a symlink; name the file itself") from None
        raise ConfigurationError(f"{where}: {exc.strerror or exc}") from None
    try:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise ConfigurationError(f"{where}: not a regular file")
        if found.st_uid != os.geteuid():
            raise ConfigurationError(f"{where}: owned by uid {found.st_uid}, not this user "
                                     f"({os.geteuid()}); use a file of your own, mode 600")
        if found.st_mode & 0o077:
            raise ConfigurationError(f"{where}: other users can read or change it (mode "
                                     f"{stat.S_IMODE(found.st_mode):o}); chmod 600 it")
        with os.fdopen(os.dup(fd), "rb") as file:
            data = file.read()
    except OSError as exc:
        raise ConfigurationError(f"{where}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigurationError(f"{where}: not UTF-8 text") from None


def _candidates(uid: int) -> list[Path]:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    found = []
    if os.path.isabs(cache) and os.path.isdir(cache) and _reachable(Path(cache)):
        found.append(Path(cache) / "toolseam")
    found.append(Path(tempfile.gettempdir()) / f"toolseam-{uid}")
    return found


def staging_root() -> Path:
    """This user's staging root, checked now (made if missing)."""
    uid = os.geteuid()
    problems = []
    for root in _candidates(uid):
        try:
            check_ancestors(root, uid)
            with contextlib.suppress(FileExistsError):
                os.mkdir(root, _ROOT_MODE)
            check_owned(root, uid, exact_owner=True)
            if stat.S_IMODE(os.lstat(root).st_mode) != _ROOT_MODE:
                os.chmod(root, _ROOT_MODE)  # ours (checked): at 0700 a rootless engine stops
            return root
        except (UnsafePath, OSError) as exc:
            problems.append(str(exc))
    if not _private:
        private = Path(tempfile.mkdtemp(prefix=f"toolseam-{uid}-private-"))
        private.chmod(_ROOT_MODE)
        atexit.register(_remove_unless_mounted, private)
        _private.append(private)
        _log.warning("staging the sandbox agent in %s for this process only: %s", private,
                     "; ".join(problems))
    return _private[0]


def user_dir(name: str) -> Path:
    """``name`` below this user's staging root (0711, this user's alone, checked now): where
    the container wing keeps its pool and socket directories, never the shared temp dir — a
    name another local user planted there is never looked at (issue 32)."""
    path = staging_root() / name
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, _ROOT_MODE)
    check_owned(path, os.geteuid(), exact_owner=True)
    return path


def own_entries(directory: Path) -> list[tuple[Path, int]]:
    """The entries of ``directory`` that are real directories of this user's that no one else
    may write, each with a descriptor opened on it (``O_NOFOLLOW``) and checked to be what was
    looked at — the caller closes them. Anything else (a symlink, another user's directory, a
    group- or world-writable one, a file) is left alone."""
    uid = os.geteuid()
    found = []
    for entry in sorted(directory.iterdir()):
        try:
            seen = os.lstat(entry)
            if not stat.S_ISDIR(seen.st_mode) or seen.st_uid != uid or seen.st_mode & 0o022:
                continue
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino):
            os.close(fd)  # swapped between the look and the open
            continue
        found.append((entry, fd))
    return found


def read_own_file(dir_fd: int, name: str, limit: int = 4096) -> str | None:
    """A small regular file of this user's in an opened directory (never through a link)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        return os.read(fd, limit).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _remove_unless_mounted(root: Path) -> None:
    """Remove this process's private root at exit — unless something is mounted at or below
    it: a pool left open has a session's base dir bind-mounted on a slot there, and ``rmtree``
    would delete the base dir's files through the mount. Another local user can force root
    into a private root (by making ``<tmp>/toolseam-0`` first), so this is theirs to trigger;
    such a root is left in place with a warning instead."""
    real = os.path.realpath(root)
    try:
        points = [mounted.point for mounted in mount_table()]
    except OSError:
        points = [real]  # cannot tell: keep it
    mounted = [p for p in points if p == real or p.startswith(real + "/")]
    if mounted:
        _log.warning("not removing %s at exit: %s is still mounted below it", root, mounted[0])
        return
    shutil.rmtree(root, ignore_errors=True)


def write_manifest(work: Path) -> None:
    """Seal a staged directory's content: every file's sha256."""
    lines = [f"{_sha256(path)}  {rel}" for rel, path in _files(work)]
    (work / MANIFEST).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (work / MANIFEST).chmod(0o644)


def verified(staged: Path) -> bool:
    """Whether ``staged`` may be reused as it is (see the module's docstring)."""
    try:
        top = os.lstat(staged)
    except FileNotFoundError:
        return False
    uid = os.geteuid()
    identity = (top.st_dev, top.st_ino, top.st_mtime_ns)
    if _verified.get(str(staged)) == identity:
        return _quietly(lambda: check_owned(staged, uid, exact_owner=True))
    try:
        for entry in [staged, *staged.rglob("*")]:
            st = os.lstat(entry)
            if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                raise UnsafePath(f"{entry} is neither a file nor a directory")
            if st.st_uid != uid or st.st_mode & 0o022:
                raise UnsafePath(f"{entry} is not this user's alone")
        expected = {}
        for line in (staged / MANIFEST).read_text("utf-8").splitlines():
            digest, rel = line.split("  ", 1)
            expected[rel] = digest
        actual = {rel: _sha256(path) for rel, path in _files(staged)}
        if actual != expected:
            raise UnsafePath(f"{staged} does not match its manifest")
    except (UnsafePath, OSError, ValueError) as exc:
        _log.warning("not reusing the staged sandbox agent: %s", exc)
        return False
    _verified[str(staged)] = identity
    return True


def install(work: Path, staged: Path) -> None:
    """Move a freshly staged ``work`` into place as ``staged``: a verified copy another session
    of this user put there first wins; an unverified one is moved aside and removed."""
    for _ in range(3):
        try:
            work.rename(staged)
            return
        except OSError:  # something is there
            if verified(staged):
                shutil.rmtree(work, ignore_errors=True)
                return
            aside = Path(tempfile.mkdtemp(prefix=f".{staged.name}.bad-", dir=staged.parent))
            with contextlib.suppress(OSError):
                staged.rename(aside / "old")
            shutil.rmtree(aside, ignore_errors=True)
    raise OSError(f"cannot stage the sandbox agent at {staged}")


def _files(root: Path) -> list[tuple[str, Path]]:
    return sorted((path.relative_to(root).as_posix(), path) for path in root.rglob("*")
                  if path.is_file() and path != root / MANIFEST)


def _sha256(path: Path) -> str:
    with open(path, "rb") as source:
        return hashlib.file_digest(source, "sha256").hexdigest()


def _quietly(check: Callable[[], None]) -> bool:
    try:
        check()
    except (UnsafePath, OSError):
        return False
    return True
