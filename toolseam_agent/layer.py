"""The container's writable layer outside ``/workspace``, packed and put back from inside the
sandbox (decision 440; the host's side is ``toolseam/backends/containers/layer.py``).

Run by the host as the sandbox's root, with the staged interpreter: ``--layer-pack PLAN OUT``
and ``--layer-apply ARCHIVE`` (both files in ``/workspace``, the one directory every engine's
archive API and a bind mount share with the host; docker's archive API does not see a tmpfs
such as ``/tmp``). Names are relative to ``/``; the host chose them from the engine's diff
and checks everything it reads back: this side never decides what is safe for the host.

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
LIMIT_EXIT = 3  # the layer holds more file bytes than the snapshot may (the host's limit)


class _TooBig(Exception):
    pass


def pack(plan_path: str, out_path: str) -> int:
    """A tar of ``layer/NAME`` for each name the plan lists (``changed``: headers only for
    directories, ``whole``: with everything below), every ancestor directory's header first."""
    with open(plan_path, encoding="utf-8", errors="surrogateescape") as source:
        plan = json.load(source)
    os.unlink(plan_path)
    done: set[str] = set()
    known: dict[str, list[int]] = plan.get("known", {})  # name -> the stat key stored last
    left = [int(plan["limit"])]  # file bytes the snapshot may still hold: a sparse 10 GB
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:  # file must not fill the disk the workspace is on
        with os.fdopen(fd, "wb") as out, tarfile.open(fileobj=out, mode="w",
                                                      format=tarfile.PAX_FORMAT) as tar:
            for name, whole in [*((n, False) for n in plan["changed"]),
                                *((n, True) for n in plan["whole"])]:
                parts = name.split("/")
                for depth in range(1, len(parts)):
                    _add(tar, "/".join(parts[:depth]), done, left, False, known)
                _add(tar, name, done, left, whole, known)
    except _TooBig:
        os.unlink(out_path)
        return LIMIT_EXIT
    return 0


def _add(tar: tarfile.TarFile, name: str, done: set[str], left: list[int],
         whole: bool, known: dict[str, list[int]]) -> None:
    if name in done:
        return
    path = "/" + name
    try:
        st = os.lstat(path)
        info = tar.gettarinfo(path, arcname=f"layer/{name}")
    except FileNotFoundError:
        return  # gone meanwhile
    done.add(name)
    if info is None:  # a socket
        return
    if info.isreg():
        left[0] -= info.size
        if left[0] < 0:
            raise _TooBig(name)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as data:  # a regular file a moment ago: still one?
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return
            key = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
            info.size = st.st_size
            info.pax_headers = {"TOOLSEAM.key": ":".join(map(str, key))}
            if known.get(name) == key:  # what the host stored last time: no bytes again
                info.pax_headers["TOOLSEAM.same"] = "1"
                info.size = 0
                tar.addfile(info)
            else:
                tar.addfile(info, data)
    else:
        tar.addfile(info)
    if whole and stat.S_ISDIR(st.st_mode):
        with os.scandir(path) as entries:
            children = sorted(e.name for e in entries)
        for child in children:
            try:
                if os.lstat(f"{path}/{child}").st_dev != st.st_dev:
                    continue  # another mount
            except FileNotFoundError:
                continue
            _add(tar, f"{name}/{child}", done, left, whole=True, known=known)


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


def apply(archive_path: str) -> int:
    """Put the layer back: the plan's names removed (``added`` whatever they are, ``changed``
    unless a directory), ``/tmp`` emptied, then ``image/`` members (the image's own files a
    command deleted since), the snapshot's deleted names removed, ``layer/`` members."""
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
                for name in plan["added"]:
                    _remove(name)
                for name in plan["changed"]:
                    _remove(name, keep_dir=True)
                for name in plan["emptied"]:
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
            if int(st.st_mtime) != int(mtime):
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
