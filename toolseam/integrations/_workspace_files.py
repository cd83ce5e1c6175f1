"""``ToolseamWorkspace``'s file operations: the seam's own (a stat that follows links and says
what is missing, a listing, whole-file bytes), with pydantic-ai's builtin errors."""

from __future__ import annotations

import asyncio
import errno
import posixpath

from pydantic_ai.workspaces import FileEntry

from ..seam.errors import FileOpError
from ..seam.models import FileStat, PathRef
from ..session.raw import ExecResult, os_error
from ..session.toolkit import Toolkit


async def write_bytes(tk: Toolkit, path: str, data: bytes) -> None:
    """Through an existing symlink: the raw write replaces the path it is given."""
    found = await _stat(tk, path)
    await tk.sandbox.write_bytes(found.canonical if found.kind == "file" else path, data)


async def stat(tk: Toolkit, path: str) -> FileEntry:
    found = await _stat(tk, path)
    if found.kind == "missing":
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    return _entry(tk, path, found.kind, found.size)


async def list_dir(tk: Toolkit, path: str) -> list[FileEntry]:
    ref = PathRef(base=tk.base_dir, path=path)
    try:
        listing = await tk.backend.list_dir(ref, 1 << 30)
    except FileOpError as exc:
        raise os_error(exc, path) from None
    directory = _absolute(tk, path)
    names = sorted(entry.rstrip("/") for entry in listing.entries)
    # a symlink is listed by its own name: its target's kind comes from a stat
    found = await asyncio.gather(*(_stat_or_none(tk, posixpath.join(directory, name))
                                   for name in names))
    return [_entry(tk, posixpath.join(directory, name), stat.kind if stat else "other",
                   stat.size if stat else None) for name, stat in zip(names, found, strict=True)]


async def make_dir(tk: Toolkit, path: str) -> None:
    target = _absolute(tk, path)
    probe = target
    while probe != "/":  # the nearest existing ancestor decides the builtin error
        found = await _stat(tk, probe)
        if found.kind == "dir":
            break
        if found.kind != "missing":
            if probe == target:
                raise FileExistsError(errno.EEXIST, "File exists", path)
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)
        probe = posixpath.dirname(probe)
    if probe != target:
        _checked(await tk.sandbox.exec(["mkdir", "-p", "--", target]), path)


async def remove(tk: Toolkit, path: str) -> None:
    target = _absolute(tk, path)
    base = tk.base_dir
    if target == "/" or base == target or base.startswith(target.rstrip("/") + "/"):
        raise ValueError(f"refusing to remove {path!r}: the working directory or one of its "
                         "ancestors")
    # -L too: a symlink (dangling or not) is removed itself, never what it points to
    done = await tk.sandbox.exec(["sh", "-c", '[ -e "$1" ] || [ -L "$1" ] || exit 3; '
                                  'rm -rf -- "$1"', "sh", target])
    if done.exit_code == 3:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
    _checked(done, path)


async def exists(tk: Toolkit, path: str) -> bool:
    found = await _stat_or_none(tk, path)
    return found is not None and found.kind != "missing"


async def realpath(tk: Toolkit, path: str) -> str:
    return (await _stat(tk, path)).canonical


def _checked(result: ExecResult, path: str) -> None:
    if result.exit_code != 0:
        message = result.stderr.strip() or f"exit code {result.exit_code}"
        if "Permission denied" in message:
            raise PermissionError(errno.EACCES, message, path)
        raise OSError(errno.EIO, message, path)


def _absolute(tk: Toolkit, path: str) -> str:
    return posixpath.normpath(posixpath.join(tk.base_dir, path))


def _entry(tk: Toolkit, path: str, kind: str, size: int | None) -> FileEntry:
    absolute = _absolute(tk, path)
    return FileEntry(name=posixpath.basename(absolute), path=absolute, is_dir=kind == "dir",
                     size=size if kind == "file" else None)


async def _stat(tk: Toolkit, path: str) -> FileStat:
    try:
        return await tk.backend.stat(PathRef(base=tk.base_dir, path=path))
    except FileOpError as exc:
        if "symbolic links" in (exc.detail or ""):  # a loop: an error, never a hang
            raise OSError(errno.ELOOP, "Too many levels of symbolic links", path) from None
        raise os_error(exc, path) from None


async def _stat_or_none(tk: Toolkit, path: str) -> FileStat | None:
    try:
        return await _stat(tk, path)
    except OSError:
        return None
