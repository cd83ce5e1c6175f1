"""Every change a copy-back makes to the host, one method each: the one place a test makes
the host's disk fail (or race) at the n-th change."""

from __future__ import annotations

import os


class HostOps:
    """The changes ``apply`` makes to the host, one method each (tests make one fail)."""

    def mkdir(self, name: str, mode: int, dir_fd: int) -> None:
        os.mkdir(name, mode, dir_fd=dir_fd)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def symlink(self, target: str, name: str, dir_fd: int) -> None:
        os.symlink(target, name, dir_fd=dir_fd)

    def rename(self, src: str, dst: str, src_dir_fd: int, dst_dir_fd: int) -> None:
        os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def link(self, src: str, dst: str, src_dir_fd: int, dst_dir_fd: int) -> None:
        os.link(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=False)

    def rmdir(self, name: str, dir_fd: int) -> None:
        os.rmdir(name, dir_fd=dir_fd)

    def chmod(self, name: str, mode: int, dir_fd: int) -> None:
        os.chmod(name, mode, dir_fd=dir_fd, follow_symlinks=False)

    def utime(self, fd: int, ns: tuple[int, int]) -> None:
        os.utime(fd, ns=ns)
