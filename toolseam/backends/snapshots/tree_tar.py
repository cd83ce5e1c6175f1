"""A file, link or directory of this machine as a tar, read the way ``capture.walk`` reads a
tree: never through a path a command in a sandbox can change while it is read.

``tarfile.add(path, recursive=True)`` ``lstat``s a name, then lists or opens it by its path
again: a command that swaps a sub-directory for a link to ``/`` between the two makes the
reader pack files outside the tree (decision 510). Here every directory is opened
``O_NOFOLLOW`` below its parent's descriptor and walked only if it is the directory whose
header was written (``st_dev``, ``st_ino``); every file is opened ``O_PATH`` below its
directory, checked the same way, and read through that descriptor, its header carrying the
size of the opened file; a link's target is read below its directory. A name swapped
meanwhile is ``TreeChangedError`` (nothing read after the swap came from outside; the caller
packs again); one removed meanwhile is left out (a directory whose header was written stays,
empty: what it held is gone either way). Members are what ``tarfile.add`` makes of a quiet
tree, but a second name of a file is a file again, not a hard link: directories, files,
symlinks as links, fifos and devices as headers (the copy-back rule refuses them by name, so
the home keeps what it has there), sockets left out.

``limit``: the most bytes the archive may reach; a file that would take it past is
``TreeTooLargeError`` before a byte of it is read (a sandbox's sparse terabyte costs nothing).
"""

from __future__ import annotations

import os
import stat
import tarfile
from typing import IO

from ...seam.errors import CouldNotRunError
from .capture import TreeChangedError, Walked, walk

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_SPECIAL = {stat.S_IFIFO: tarfile.FIFOTYPE, stat.S_IFCHR: tarfile.CHRTYPE,
            stat.S_IFBLK: tarfile.BLKTYPE}


class TreeTooLargeError(CouldNotRunError):
    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(f"packing stopped at {path!r}: the archive would reach {size} bytes, "
                         f"more than {limit}", retryable=False)
        self.path, self.size, self.limit = path, size, limit


def pack_tree(path: str, arcname: str, out: IO[bytes], limit: int | None = None) -> None:
    """``path`` as a tar written to ``out``, its first member ``arcname`` and every other below
    it (a directory's); ``path``'s parent is the caller's, trusted."""
    parent, name = os.path.split(os.path.abspath(path))
    parent_fd = os.open(parent, _DIR_FLAGS)
    try:
        top = Walked(arcname, name, parent_fd,
                     os.stat(name, dir_fd=parent_fd, follow_symlinks=False))
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            packer = _Packer(tar, limit)
            packer.add(top, arcname)
            if stat.S_ISDIR(top.st.st_mode):
                try:
                    root_fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
                except OSError as exc:  # a link or a file since its lstat
                    raise TreeChangedError(path) from exc
                try:
                    found = os.fstat(root_fd)
                    if (found.st_dev, found.st_ino) != (top.st.st_dev, top.st.st_ino):
                        raise TreeChangedError(path)
                    for item in walk(root_fd, skip=_nothing, strict=True):
                        packer.add(item, f"{arcname}/{item.path}")
                finally:
                    os.close(root_fd)
    finally:
        os.close(parent_fd)


def _nothing(_name: str) -> bool:
    return False  # a packed tree is the caller's whole tree: no name of it is toolseam's


def _open_same_file(item: Walked) -> int:
    """The regular file ``item`` was, open for reading; -1 when it was removed since, and
    ``TreeChangedError`` when it is something else now. The name is first opened ``O_PATH``
    (which opens nothing: a fifo or a device swapped in is not opened, so none of its open's
    effects happen), checked, and only then opened for reading through that very descriptor
    (``/proc/self/fd``: the same inode, whatever the name is by then); where ``/proc`` is not
    mounted, by its name again, checked once more."""
    try:
        handle = os.open(item.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=item.parent_fd)
    except FileNotFoundError:
        return -1
    try:
        _same(item, os.fstat(handle))
        try:
            fd = os.open(f"/proc/self/fd/{handle}", _FILE_FLAGS & ~os.O_NOFOLLOW)
        except FileNotFoundError:  # no /proc here
            try:
                fd = os.open(item.name, _FILE_FLAGS, dir_fd=item.parent_fd)
            except OSError as exc:  # a link now (ELOOP), or gone meanwhile
                raise TreeChangedError(item.path) from exc
    finally:
        os.close(handle)
    try:
        _same(item, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _same(item: Walked, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (item.st.st_dev,
                                                                   item.st.st_ino):
        raise TreeChangedError(item.path)  # another file, a link or a fifo since the lstat


class _Packer:
    def __init__(self, tar: tarfile.TarFile, limit: int | None) -> None:
        self.tar, self.limit = tar, limit

    def add(self, item: Walked, arcname: str) -> None:
        st = item.st
        info = tarfile.TarInfo(arcname)
        info.mode, info.mtime = stat.S_IMODE(st.st_mode), st.st_mtime
        info.uid, info.gid = st.st_uid, st.st_gid
        kind = stat.S_IFMT(st.st_mode)
        if kind == stat.S_IFREG:
            self._add_file(item, info)
            return
        # a name removed since its look is left out, as if the listing came a moment later
        # (no header of it is written yet); one that became something else is packed again
        if kind == stat.S_IFDIR:
            info.type = tarfile.DIRTYPE
        elif kind == stat.S_IFLNK:
            info.type = tarfile.SYMTYPE
            try:
                info.linkname = os.readlink(item.name, dir_fd=item.parent_fd)
            except FileNotFoundError:
                return
            except OSError as exc:  # no link any more (EINVAL)
                raise TreeChangedError(item.path) from exc
        elif kind in _SPECIAL:
            info.type = _SPECIAL[kind]
            if kind != stat.S_IFIFO:
                info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
        else:
            return  # a socket: tarfile leaves it out too
        self.tar.addfile(info)
        self._check(item.path, 0)

    def _add_file(self, item: Walked, info: tarfile.TarInfo) -> None:
        fd = _open_same_file(item)
        if fd < 0:
            return  # removed since its look
        with os.fdopen(fd, "rb") as source:
            st = os.fstat(fd)
            self._check(item.path, st.st_size)  # before a byte is read
            info.size = st.st_size
            try:
                self.tar.addfile(info, source)
            except OSError as exc:  # cut shorter than its size while it was read
                raise TreeChangedError(item.path) from exc

    def _check(self, path: str, coming: int) -> None:
        """The archive so far (headers included), plus ``coming`` file bytes, within limit."""
        if self.limit is None:
            return
        size = self.tar.offset + coming
        if size > self.limit:
            raise TreeTooLargeError(path, size, self.limit)
