"""Trees and archives for copy-back tests: a tree as a dict, its archive as a sandbox sends it,
a copy-back started, and file operations that fail on cue."""

from __future__ import annotations

import errno
import io
import os
import stat
import tarfile
from pathlib import Path

from toolseam.backends.containers.workspace_sync.host_ops import HostOps
from toolseam.backends.containers.workspace_sync.tar_sync import WorkspaceCopy


def tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """Every entry below root (staging dirs too): kind, permission bits, content or target."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            rel = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", stat.S_IMODE(st.st_mode), "")
            elif stat.S_ISREG(st.st_mode):
                found[rel] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes().hex())
            else:
                found[rel] = ("special", stat.S_IMODE(st.st_mode), "")
    return found


def archive_of(sandbox: Path) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(sandbox, arcname="workspace")
    buffer.seek(0)
    return buffer


def started(host: Path, sandbox: Path | None = None, **options: bool) -> WorkspaceCopy:
    copy = WorkspaceCopy(str(host), **options)
    buffer = io.BytesIO()
    copy.pack(buffer)
    if sandbox is not None:
        buffer.seek(0)
        with tarfile.open(fileobj=buffer) as tar:
            tar.extractall(sandbox, filter="tar")
    return copy


class FailingOps(HostOps):
    """The host's disk failing at the n-th change (every method of HostOps counts)."""

    def __init__(self, at: int, code: int = errno.ENOSPC) -> None:
        self.at, self.code, self.calls, self.failed_in = at, code, 0, ""

    def __getattribute__(self, name: str) -> object:
        value = object.__getattribute__(self, name)
        if name in ("mkdir", "write", "symlink", "rename", "link", "rmdir", "chmod", "utime"):
            def counted(*args: object) -> object:
                self.calls += 1
                if self.calls == self.at:
                    self.failed_in = name
                    raise OSError(self.code, os.strerror(self.code))
                return value(*args)
            return counted
        return value
