"""This user's working directories — pool directories, bind mode's socket directories, host
sessions' socket directories — under one root only this user can change (decision 150).

Made in the shared temp dir, such a directory's name is something any local user can plant
first, and the janitor that cleans up after killed processes acts on what it finds: it used to
follow a planted ``toolseam-pool-x -> /dev/shm`` and, as root, unmount ``/dev/shm``. So:

* **one root per user**: ``<staging root>/run`` (``staging.py`` checks the staging root and
  every directory above it); made 0711 — a rootless engine's user passes through to a slot or
  a socket directory whose random name it is given, and lists nothing.
* **the janitor trusts nothing it finds**: it walks the root by directory descriptors, opened
  with ``O_NOFOLLOW``; an entry counts only if it is a real directory owned by this user that
  no one else may write, and the files inside are read relative to that descriptor.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from .staging import UnsafePath, check_owned, staging_root

_RUN = "run"
_ROOT_MODE = 0o711
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def private_root() -> Path:
    """This user's root for working directories, checked now (made if missing); its real
    path, so mount points below it read as /proc/self/mountinfo writes them. Raises
    UnsafePath (or OSError) when it is not this user's alone."""
    root = staging_root() / _RUN
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, _ROOT_MODE)
    check_owned(root, os.geteuid(), exact_owner=True)
    if stat.S_IMODE(os.lstat(root).st_mode) != _ROOT_MODE:
        os.chmod(root, _ROOT_MODE)
    real = Path(os.path.realpath(root))
    if real != root:  # a component above was a symlink: check where it led
        check_owned(real, os.geteuid(), exact_owner=True)
    return real


def make_private_dir(prefix: str) -> str:
    """A fresh directory (0700, random name) under this user's root."""
    return tempfile.mkdtemp(prefix=prefix, dir=private_root())


def own_entries(prefix: str, *, any_owner: bool = False) -> Iterator[tuple[str, int]]:
    """The directories named ``prefix*`` under this user's root that are real directories
    (no symlink followed), owned by this user (``any_owner``: by anyone — one this process
    handed to a rootless engine's user) and writable by no one else: each as its path and an
    open descriptor, closed when the caller moves on. Nothing when the root is unsafe."""
    try:
        root = private_root()
        root_fd = os.open(root, _DIR_FLAGS)
    except (UnsafePath, OSError):
        return
    try:
        uid = os.geteuid()
        for name in sorted(os.listdir(root_fd)):
            if not name.startswith(prefix):
                continue
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
            except OSError:
                continue  # a symlink (ELOOP), not a directory, or gone
            try:
                st = os.fstat(fd)
                if (any_owner or st.st_uid == uid) and not st.st_mode & 0o022:
                    yield os.path.join(root, name), fd
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)


def read_inside(dir_fd: int, name: str, limit: int = 4096) -> str:
    """A small regular file in a verified directory, read without following a symlink."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                 dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{name} is not a regular file")
        return os.read(fd, limit).decode("utf-8", "replace")
    finally:
        os.close(fd)
