"""The container's writable layer outside ``/workspace``, put back from inside the sandbox
(decision 440; the host's side is ``toolseam/backends/containers/layer.py``; ``pack.py`` packs
it).

Run by the host as the sandbox's root, with the staged interpreter: ``--layer-apply ARCHIVE``
(a file in ``/workspace``, the one directory every engine's archive API and a bind mount share
with the host; docker's archive API does not see a tmpfs such as ``/tmp``). Names are relative
to ``/``; the host chose them from the engine's diff.

Every directory on the way to a name is opened ``O_NOFOLLOW`` below its parent, so a link a
command left cannot redirect a write (it could only redirect inside the container anyway: this
runs there). Nothing below another mount is walked (``st_dev``).
"""

from __future__ import annotations

import json
import os
import stat
import tarfile
from typing import Any

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KEPT = 0o1777  # never set-id
_WORKING = ".toolseam-layer-"  # toolseam's own files at the top of /workspace


def _parent(name: str, make: bool) -> tuple[int, str]:
    """The open directory ``name`` is in, and its last part; made as needed when ``make``."""
    *dirs, last = name.split("/")
    fd = os.open("/", _DIR)
    try:
        for part in dirs:
            try:
                child = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                if not make:
                    raise
                os.mkdir(part, 0o700, dir_fd=fd)
                child = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd, last


def _remove_at(fd: int, name: str) -> None:
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        _enterable(fd, name, st.st_mode)
        inner = os.open(name, _DIR, dir_fd=fd)  # links removed below, never followed
        try:
            for child in os.listdir(inner):
                _remove_at(inner, child)
        finally:
            os.close(inner)
        os.rmdir(name, dir_fd=fd)
    else:
        os.unlink(name, dir_fd=fd)


def _enterable(fd: int, name: str, mode: int) -> None:
    """A directory made owner-rwx: the sandbox's root may lack CAP_DAC_OVERRIDE."""
    if mode & 0o700 != 0o700:
        os.chmod(name, stat.S_IMODE(mode) | 0o700, dir_fd=fd, follow_symlinks=False)


def _remove(name: str, keep_dir: bool = False) -> None:
    try:
        fd, last = _parent(name, make=False)
    except (FileNotFoundError, NotADirectoryError, OSError):
        return  # a parent is gone (removed first) or is not a directory: nothing below it
    try:
        if keep_dir:
            try:
                if stat.S_ISDIR(os.stat(last, dir_fd=fd, follow_symlinks=False).st_mode):
                    return
            except FileNotFoundError:
                return
        _remove_at(fd, last)
    finally:
        os.close(fd)


def _keep_only(name: str, children: set[str]) -> None:
    """Remove every entry of the directory ``name`` but ``children`` (a copy-mode workspace
    made a snapshot's, decision 468: what the snapshot lacks, fifos and sockets too). A name
    that is no directory now is left: the archive's member replaces it."""
    try:
        fd, last = _parent(name, make=False)
    except OSError:
        return
    try:
        try:
            st = os.stat(last, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                return
            _enterable(fd, last, st.st_mode)
            inner = os.open(last, _DIR, dir_fd=fd)
        except OSError:
            return
        try:
            for child in os.listdir(inner):
                if child not in children:
                    _remove_at(inner, child)
        finally:
            os.close(inner)
    finally:
        os.close(fd)


def apply(archive_path: str) -> int:
    """Put the layer back: the plan's names removed (``drop``: the host's read pack outputs,
    ``added`` whatever they are, ``changed`` unless a directory, what ``keep_only``'s
    directories hold beyond their names), ``emptied`` ones emptied, then ``image/`` members
    (the image's own files a command deleted since), the snapshot's deleted names removed,
    ``layer/`` members."""
    dir_modes: list[tuple[str, int, float]] = []
    with open(archive_path, "rb") as source, tarfile.open(fileobj=source, mode="r|") as tar:
        os.unlink(archive_path)  # open: read to its end, never seen again
        plan: dict[str, Any] = {}
        deleted_done = False
        for member in tar:
            if member.name == "plan.json":
                data = tar.extractfile(member)
                assert data is not None
                plan = json.loads(data.read().decode("utf-8", "surrogateescape"))
                for name in plan.get("drop", []):  # the host's own pack outputs, read
                    if name.startswith(_WORKING) and "/" not in name:
                        _remove(f"workspace/{name}")
                for name in plan["added"]:
                    _remove(name)
                for name in plan["changed"]:
                    _remove(name, keep_dir=True)
                for name, children in plan.get("keep_only", {}).items():
                    _keep_only(name, set(children))
                for name in plan.get("emptied", []):
                    fd, last = _parent(name, make=False)
                    try:
                        inner = os.open(last, _DIR, dir_fd=fd)
                    finally:
                        os.close(fd)
                    try:
                        for child in os.listdir(inner):
                            _remove_at(inner, child)
                    finally:
                        os.close(inner)
                continue
            part, _, name = member.name.partition("/")
            if part == "layer" and not deleted_done:
                for gone in plan["deleted"]:
                    _remove(gone)
                deleted_done = True
            if part in ("image", "layer") and name:
                _extract(tar, member, name, dir_modes)
        if not deleted_done:
            for gone in plan.get("deleted", []):
                _remove(gone)
    for name, mode, mtime in sorted(dir_modes, key=lambda d: -d[0].count("/")):
        fd, last = _parent(name, make=False)
        try:
            st = os.stat(last, dir_fd=fd, follow_symlinks=False)
            if stat.S_IMODE(st.st_mode) != mode:
                os.chmod(last, mode, dir_fd=fd, follow_symlinks=False)
            # the exact time, not its whole second: a snapshot reads it rounded on an engine
            # whose archive rounds (podman), so T.6 left in place of T reads as T+1
            if st.st_mtime_ns != round(mtime * 1_000_000_000):
                os.utime(last, (mtime, mtime), dir_fd=fd, follow_symlinks=False)
        except OSError:
            pass  # a read-only directory of the image (its mode is the image's)
        finally:
            os.close(fd)
    return 0


def _extract(tar: tarfile.TarFile, member: tarfile.TarInfo, name: str,
             dir_modes: list[tuple[str, int, float]]) -> None:
    fd, last = _parent(name, make=True)
    try:
        mode = member.mode & _KEPT
        if member.isdir():
            try:
                st = os.stat(last, dir_fd=fd, follow_symlinks=False)
                is_dir = stat.S_ISDIR(st.st_mode)
                if is_dir:
                    _enterable(fd, last, st.st_mode)  # its own mode comes last
            except FileNotFoundError:
                is_dir = False
            if not is_dir:
                _remove_at(fd, last)
                os.mkdir(last, 0o700, dir_fd=fd)
            dir_modes.append((name, mode, member.mtime))
            return
        _remove_at(fd, last)
        if member.issym():
            os.symlink(member.linkname, last, dir_fd=fd)
            os.utime(last, (member.mtime, member.mtime), dir_fd=fd, follow_symlinks=False)
        elif member.islnk():
            source_fd, source_last = _parent(member.linkname.partition("/")[2], make=False)
            try:
                os.link(source_last, last, src_dir_fd=source_fd, dst_dir_fd=fd,
                        follow_symlinks=False)
            finally:
                os.close(source_fd)
        elif member.isreg():
            data = tar.extractfile(member)
            assert data is not None
            out = os.open(last, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                          | os.O_CLOEXEC, 0o600, dir_fd=fd)
            try:
                while chunk := data.read(1 << 20):
                    os.write(out, chunk)
                os.fchmod(out, mode)
                os.utime(out, (member.mtime, member.mtime))
            finally:
                os.close(out)
    finally:
        os.close(fd)
