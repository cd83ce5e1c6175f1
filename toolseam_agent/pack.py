"""Files packed into a tar by the sandbox's root, sending only what changed (decisions 441,
443, 467): the container's writable layer outside ``/workspace`` (``toolseam_agent/layer.py``
puts it back) and, in copy mode, ``/workspace`` itself.

``--layer-pack PLAN OUT [PLAN OUT]…``, all files in ``/workspace``, packed in order (one run of
the interpreter for the layer and the workspace); the exit status of the first that fails,
plus 16 times its place. The plan names a ``base`` (``""``: names
relative to ``/``; ``"workspace"``: relative to ``/workspace``, the name ``""`` being that
directory), the archive's first name component (``prefix``), the names to pack (``changed``:
headers only for directories, ``whole``: with everything below), the file bytes the snapshot may
still hold (``limit``: a sparse 10 GB file must not fill the disk ``/workspace`` is on), and the
stat key (inode, size, mtime_ns, ctime_ns) of each file the host stored last (``known``): a file
whose key is the same is sent as a header marked unchanged, without bytes. ``dirs``: a summary
of each directory's entries that are not directories (names, kinds, modes, keys) as the host
last saw them; a directory packed whole carries its summary now (``TOOLSEAM.sum``) and, when
it is the one the host gave, is marked unchanged (``TOOLSEAM.same``): its entries that are not
directories are not sent at all, only its sub-directories are walked — so an unchanged
directory costs the host one header, whatever it holds. ``seconds``: times
made whole seconds ("truncate" or "round") as the engine's archive API makes them (a copy-mode
workspace's manifest is the same whichever way it was read). The host checks everything it
reads back (names, sizes before bytes, "unchanged" only for a key it knows): this side never
decides what is safe for the host. Nothing below another mount is walked (``st_dev``);
toolseam's own working files at the top of ``/workspace`` (this pack's output) are never packed.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import tarfile
from dataclasses import dataclass, field

LIMIT_EXIT = 3  # the files hold more bytes than the snapshot may (the host's limit)
RACE_EXIT = 4  # a name changed kind twice while it was packed
DENIED_EXIT = 5  # a name the sandbox's root may not read (no CAP_DAC_OVERRIDE): the host
                 # reads the engine's whole archive instead
_WORKING = (".toolseam-restore-", ".toolseam-sync-", ".toolseam-layer-")  # never packed


class _TooBig(Exception):
    pass


class _Raced(Exception):
    pass


@dataclass
class _Packing:
    tar: tarfile.TarFile
    base: str
    prefix: str
    known: dict[str, list[int]]
    left: int
    seconds: str  # "": as they are; "truncate" or "round" to whole seconds
    dirs: dict[str, str] | None = None  # a directory's summary as the host last saw it
    done: set[str] = field(default_factory=set)

    def mtime(self, mtime_ns: int) -> float:
        if self.seconds == "truncate":
            return mtime_ns // 1_000_000_000
        if self.seconds == "round":  # Go's Time.Round: a half second rounds up
            return (mtime_ns + 500_000_000) // 1_000_000_000
        return mtime_ns / 1_000_000_000

    def path(self, name: str) -> str:
        return "/".join(("", self.base, name) if self.base else ("", name)).rstrip("/") or "/"

    def arcname(self, name: str) -> str:
        return f"{self.prefix}/{name}" if name else self.prefix


def pack_all(pairs: list[str]) -> int:
    """``PLAN OUT`` pairs packed in order; 0, or the first failure's status + 16 x its place."""
    for place in range(len(pairs) // 2):
        status = pack(pairs[2 * place], pairs[2 * place + 1])
        if status:
            return status + 16 * place
    return 0


def pack(plan_path: str, out_path: str) -> int:
    """The tar of the plan's names, every ancestor directory's header first."""
    with open(plan_path, encoding="utf-8", errors="surrogateescape") as source:
        plan = json.load(source)
    os.unlink(plan_path)
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w",
                                                      format=tarfile.PAX_FORMAT) as tar:
            packing = _Packing(tar, str(plan.get("base", "")), str(plan.get("prefix", "layer")),
                               plan.get("known", {}), int(plan["limit"]),
                               str(plan.get("seconds", "")), plan.get("dirs"))
            for name, whole in [*((n, False) for n in plan["changed"]),
                                *((n, True) for n in plan["whole"])]:
                parts = name.split("/") if name else []
                for depth in range(1, len(parts)):
                    _add(packing, "/".join(parts[:depth]), False)
                _add(packing, name, whole)
    except _TooBig:
        os.unlink(out_path)
        return LIMIT_EXIT
    except _Raced:
        os.unlink(out_path)
        return RACE_EXIT
    except PermissionError:
        os.unlink(out_path)
        return DENIED_EXIT
    return 0


def _add(p: _Packing, name: str, whole: bool, tries: int = 2) -> None:
    if name in p.done:
        return
    path = p.path(name)
    try:
        st = os.lstat(path)
        info = p.tar.gettarinfo(path, arcname=p.arcname(name))
    except FileNotFoundError:
        return  # gone meanwhile
    p.done.add(name)
    if info is None:  # a socket
        return
    if p.seconds:
        info.mtime = p.mtime(st.st_mtime_ns)
    if info.isreg() and not _add_file(p, name, path, info):
        p.done.discard(name)  # swapped for a link, a fifo or nothing since its lstat
        if tries <= 1:
            raise _Raced(name)
        _add(p, name, whole, tries - 1)
        return
    if not (whole and stat.S_ISDIR(st.st_mode)):
        if not info.isreg():
            p.tar.addfile(info)
        return
    listing = _listing(name, path, st)
    same = False
    if p.dirs is not None:
        summary = _summary(listing)
        same = p.dirs.get(name) == summary
        info.pax_headers = {"TOOLSEAM.sum": summary, **({"TOOLSEAM.same": "1"} if same else {})}
    p.tar.addfile(info)
    for child, child_st in listing:
        inner = f"{name}/{child}" if name else child
        if same and not stat.S_ISDIR(child_st.st_mode):
            if stat.S_ISREG(child_st.st_mode) and child_st.st_nlink > 1:
                # a later name of the same file is a hard link to the first, as when it is sent
                inodes: dict[tuple[int, int], str] = p.tar.inodes  # type: ignore[attr-defined]
                inodes.setdefault((child_st.st_ino, child_st.st_dev), p.arcname(inner))
            continue
        _add(p, inner, whole=True)


def _listing(name: str, path: str, st: os.stat_result) -> list[tuple[str, os.stat_result]]:
    """A directory's entries in the order of their bytes (as the engines' archive), with their
    ``lstat``; toolseam's own working files at the top and other mounts left out."""
    with os.scandir(path) as entries:
        children = sorted((e.name for e in entries), key=os.fsencode)
    listing = []
    for child in children:
        if not name and child.startswith(_WORKING):
            continue  # toolseam's own working file (this pack's output among them)
        try:
            child_st = os.lstat(f"{path}/{child}")
        except FileNotFoundError:
            continue
        if child_st.st_dev != st.st_dev:
            continue  # another mount
        listing.append((child, child_st))
    return listing


def _summary(listing: list[tuple[str, os.stat_result]]) -> str:
    """What a directory's entries that are not directories are: their names, kinds and modes,
    inodes, sizes, times — ctime too, which no command can set back."""
    digest = hashlib.sha256()
    for child, st in listing:
        if not stat.S_ISDIR(st.st_mode):
            digest.update(os.fsencode(child) + b"\0" + (
                f"{st.st_mode}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:"
                f"{st.st_nlink}\n").encode())
    return digest.hexdigest()


def _add_file(p: _Packing, name: str, path: str, info: tarfile.TarInfo) -> bool:
    """A regular file's header and (unless unchanged since ``known``) its bytes; False when
    it is no regular file by the time it is opened (nothing was added then)."""
    if info.size > p.left:
        raise _TooBig(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT):
            return False
        raise
    with os.fdopen(fd, "rb") as data:  # a regular file a moment ago: still one?
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        p.left -= st.st_size
        if p.left < 0:
            raise _TooBig(name)
        key = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
        info.size = st.st_size
        if p.seconds:
            info.mtime = p.mtime(st.st_mtime_ns)
        info.pax_headers = {"TOOLSEAM.key": ":".join(map(str, key))}
        if p.known.get(name) == key:  # what the host stored last time: no bytes again
            info.pax_headers["TOOLSEAM.same"] = "1"
            info.size = 0
            p.tar.addfile(info)
        else:
            p.tar.addfile(info, data)
    return True
