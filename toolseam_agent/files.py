"""Point file operations: stat, read (whole or a line window), atomic write, change-set commit.

Every function takes ``(base, path, confine)`` and returns plain JSON-able values, so the host
backend calls them in-process and the sandbox agent serves them over its channel unchanged.
Failures the model can act on raise ``FsError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import secrets
import stat
from typing import Any

from .errors import (
    BINARY,
    EXISTS,
    INVALID,
    IS_DIRECTORY,
    NOT_DIRECTORY,
    NOT_FOUND,
    NOT_REGULAR,
    NOT_UTF8,
    OUTSIDE_BASE,
    PAST_END,
    PERMISSION,
    STALE,
    TOO_LARGE,
    FsError,
    from_os_error,
)
from .names import escape_name
from .paths import Resolved, open_parent, open_path, resolve

# Every rename goes through this name so a test can inject an OS failure mid-commit.
_rename = os.rename

_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def stat_path(base: str, path: str, confine: bool) -> dict[str, Any]:
    """What is at ``path``: kind (``missing`` when nothing), size, mode, executable bit."""
    r = resolve(base, path, confine)
    try:
        fd = open_path(r, os.O_PATH)
    except FsError as exc:
        if exc.code in (NOT_FOUND, NOT_DIRECTORY) and not r.trailing_slash:
            return {"kind": "missing", "canonical": r.canonical, "size": 0, "mode": 0,
                    "executable": False}
        raise
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    executable = stat.S_ISREG(st.st_mode) and bool(st.st_mode & 0o111)
    return {"kind": _kind(st.st_mode), "canonical": r.canonical, "size": st.st_size,
            "mode": stat.S_IMODE(st.st_mode), "executable": executable, "links": st.st_nlink,
            "inode": f"{st.st_dev}:{st.st_ino}"}


def _open_regular(r: Resolved) -> tuple[int, os.stat_result]:
    """Open for reading without ever blocking: O_NONBLOCK so a FIFO cannot hang the open."""
    fd = open_path(r, _READ_FLAGS)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and not r.trailing_slash:
        return fd, st
    os.close(fd)
    if stat.S_ISDIR(st.st_mode):
        raise FsError(IS_DIRECTORY, r.given)
    if r.trailing_slash:
        raise FsError(NOT_DIRECTORY, r.given)
    raise FsError(NOT_REGULAR, r.given, _kind(st.st_mode))


def read_text(base: str, path: str, confine: bool, offset: int | None = None,
              limit: int | None = None, refuse_above_bytes: int | None = None) -> dict[str, Any]:
    """UTF-8 text with universal newlines, whole or as the line window ``[offset-1, +limit)``.

    The window is read line by line, so a window never needs the whole file in memory. Its
    lines are exactly ``text.split("\\n")[offset-1 : offset-1+limit]`` of the whole text.
    """
    r = resolve(base, path, confine, canonical_needed=False)
    fd, st = _open_regular(r)
    if offset is not None or limit is not None:
        with open(fd, encoding="utf-8", errors="strict", newline=None) as f:
            try:
                text = _window(f, offset or 1, limit, refuse_above_bytes)
            except _WindowTooLarge:
                raise FsError(TOO_LARGE, path, f"a window of more than {refuse_above_bytes}") from None
            except UnicodeDecodeError:
                raise FsError(NOT_UTF8, path) from None
            return {"text": text, "size": st.st_size}
    data = _read_capped(fd, st, path, refuse_above_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise FsError(NOT_UTF8, path) from None
    if "\r" in text:  # universal newlines, as a text-mode read would give
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return {"text": text, "size": len(data)}


def _read_capped(fd: int, st: os.stat_result, path: str, refuse_above_bytes: int | None) -> bytes:
    """The whole file, or TOO_LARGE without reading it; the fd is closed either way."""
    try:
        if refuse_above_bytes is not None and st.st_size > refuse_above_bytes:
            raise FsError(TOO_LARGE, path, str(st.st_size))
        return read_whole(fd)
    finally:
        os.close(fd)


def read_whole(fd: int) -> bytes:
    """A regular file's whole content by plain reads — cheaper than a buffered file object, which
    matters when grep reads thousands of files. A short read of a regular file is its end."""
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        chunks.append(chunk)
        if len(chunk) < 1 << 16:
            return b"".join(chunks)


class _WindowTooLarge(Exception):
    pass


def _bounded(f: io.TextIOWrapper, cap: int | None) -> Any:
    """The file's lines, each read with at most ``cap`` characters held (then: too large)."""
    while True:
        line = f.readline() if cap is None else f.readline(cap + 1)
        if not line:
            return
        if cap is not None and len(line) > cap:
            raise _WindowTooLarge
        yield line


def _window(f: io.TextIOWrapper, offset: int, limit: int | None, cap: int | None = None) -> str:
    """Memory stays within ``cap`` characters: the window, and any line skipped before it."""
    start = offset - 1
    out: list[str] = []
    index = 0
    used = 0
    ended_with_newline = True  # an empty file splits to [""], like text ending in "\n"
    if limit == 0:
        return ""
    for line in _bounded(f, cap):
        ended_with_newline = line.endswith("\n")
        if index >= start:
            out.append(line[:-1] if ended_with_newline else line)
            used += len(line)
            if cap is not None and used > cap:
                raise _WindowTooLarge
            if limit is not None and len(out) >= limit:
                return "\n".join(out)  # stop before reading a line past the window
        index += 1
    # split("\n") yields one element more than iteration when the text ends with a newline
    if ended_with_newline and index >= start and (limit is None or len(out) < limit):
        out.append("")
    return "\n".join(out)


BINARY_PROBE_BYTES = 8192


def read_page(base: str, path: str, confine: bool, offset: int, limit: int, max_bytes: int,
              max_line_chars: int) -> dict[str, Any]:
    """A page of numbered lines, bounded whatever the file's shape.

    At most ``limit`` lines from line ``offset`` (1-based) and about ``max_bytes`` of text; a
    line longer than ``max_line_chars`` is cut (its number listed in ``cut``) and the rest of it
    skipped without being held. Memory stays O(max_bytes + max_line_chars) for any file: a
    1 GiB line costs one bounded buffer. NUL bytes in the first 8 KiB mean binary (refused).
    ``next`` is the offset of the first line not shown, ``total`` the line count once the
    end was reached.
    """
    r = resolve(base, path, confine, canonical_needed=False)
    fd, st = _open_regular(r)
    with io.BufferedReader(io.FileIO(fd, "r"), buffer_size=1 << 16) as f:
        if b"\0" in f.peek(BINARY_PROBE_BYTES)[:BINARY_PROBE_BYTES]:
            raise FsError(BINARY, path)
        lines: list[str] = []
        cut: list[int] = []
        used = 0
        number = 0
        for raw, was_cut in bounded_lines(f, max_line_chars * 4):
            number += 1
            if number < offset:
                continue
            if len(lines) >= limit or (lines and used + len(raw) + 1 > max_bytes):
                return {"lines": lines, "cut": cut, "next": number, "total": None,
                        "size": st.st_size}
            text = decode_line(raw, was_cut, path)
            if len(text) > max_line_chars:
                text, was_cut = text[:max_line_chars], True
            if was_cut:
                cut.append(number)
            lines.append(text)
            used += len(raw) + 1
    if number < offset and not (number == 0 and offset == 1):
        raise FsError(PAST_END, path, str(number))
    return {"lines": lines, "cut": cut, "next": None, "total": number, "size": st.st_size}


def bounded_lines(f: io.BufferedReader[io.FileIO], cap: int) -> Any:
    """(first ``cap`` bytes of each line without its ending, whether more was dropped): memory
    stays one buffer plus ``cap`` bytes, however long a line is (read, and grep's big files)."""
    while True:
        chunk = f.readline(cap)
        if not chunk:
            return
        if chunk.endswith(b"\n"):
            yield chunk[:-1].removesuffix(b"\r"), False
            continue
        dropped = False
        while True:  # the rest of a long line, read and forgotten in bounded pieces
            rest = f.readline(1 << 16)
            dropped = dropped or bool(rest.rstrip(b"\r\n"))
            if not rest or rest.endswith(b"\n"):
                break
        yield chunk.removesuffix(b"\r"), dropped


def decode_line(raw: bytes, was_cut: bool, path: str) -> str:
    """A line's text; a character split by the cut is dropped; not UTF-8: ``NOT_UTF8``."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if was_cut and exc.start >= len(raw) - 3:  # a character split by the cut
            return raw[: exc.start].decode("utf-8")
        raise FsError(NOT_UTF8, path) from None


def list_dir(base: str, path: str, confine: bool, cap: int) -> dict[str, Any]:
    """The directory's entries (a ``/`` after directories), at most ``cap`` of them, unsorted:
    the listing rule above the seam sorts and caps what the model sees."""
    r = resolve(base, path, confine, canonical_needed=False)
    fd = open_path(r, os.O_RDONLY | os.O_DIRECTORY)
    entries: list[str] = []
    total = 0
    try:
        with os.scandir(fd) as it:
            for entry in it:
                total += 1
                if len(entries) < cap:
                    is_dir = entry.is_dir(follow_symlinks=False)
                    entries.append(escape_name(entry.name) + ("/" if is_dir else ""))
    finally:
        os.close(fd)
    return {"entries": entries, "total": total}


def read_bytes(base: str, path: str, confine: bool,
               refuse_above_bytes: int | None = None) -> dict[str, Any]:
    """The raw bytes of a regular file (media reads, edits)."""
    r = resolve(base, path, confine, canonical_needed=False)
    fd, st = _open_regular(r)
    data = _read_capped(fd, st, path, refuse_above_bytes)
    return {"data": data, "size": len(data), "mode": stat.S_IMODE(st.st_mode)}


class _Staged:
    """One file written to a temp name beside its target, not yet renamed into place."""

    def __init__(self, r: Resolved, data: bytes, parent: tuple[int, str] | None = None,
                 keep_bom: bool = False, private: bool = False) -> None:
        self.r = r
        if parent is None:
            self.dir_fd, self.name, self.created = open_parent(r, create=True)
        else:  # opened by the caller (the unconfined fast path); no directory was created
            (self.dir_fd, self.name), self.created = parent, []
        self.tmp: str | None = None
        self.backup: str | None = None
        self.existed = False
        self.keep_bom = keep_bom
        self.new_mode = 0o600 if private else 0o666  # before the umask; an existing file keeps its own
        try:
            self._write(data)
        except BaseException:
            self.discard()
            raise

    def _write(self, data: bytes) -> None:
        existing = _lstat_at(self.dir_fd, self.name)
        if existing is not None:
            if stat.S_ISDIR(existing.st_mode):
                raise FsError(IS_DIRECTORY, self.r.given)
            if stat.S_ISLNK(existing.st_mode):
                if not self.r.parts:  # the fast path, which resolved nothing: go the long way
                    raise _LeafIsSymlink
                # canonical paths hold no symlinks: a race
                raise FsError(OUTSIDE_BASE if self.r.confined else EXISTS, self.r.given)
            if not stat.S_ISREG(existing.st_mode):
                raise FsError(NOT_REGULAR, self.r.given, _kind(existing.st_mode))
            if not _writable(existing):
                raise FsError(PERMISSION, self.r.given, "the file is read-only")
            self.existed = True
            if self.keep_bom and not data.startswith(BOM) and self._starts_with_bom():
                data = BOM + data
        self.tmp = _temp_name(self.name, "tmp")
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     self.new_mode, dir_fd=self.dir_fd)
        try:
            if existing is not None:
                os.fchmod(fd, stat.S_IMODE(existing.st_mode))
                owner = (existing.st_uid, existing.st_gid)
                if os.geteuid() == 0 and owner != (0, os.getegid()):  # keep a user's file theirs
                    with contextlib.suppress(PermissionError):  # no CAP_CHOWN in a sandbox
                        os.fchown(fd, existing.st_uid, existing.st_gid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)

    def _starts_with_bom(self) -> bool:
        try:
            fd = os.open(self.name, _READ_FLAGS | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.dir_fd)
        except OSError:
            return False
        try:
            return os.pread(fd, len(BOM), 0) == BOM
        finally:
            os.close(fd)

    def install(self, keep_backup: bool = True) -> None:
        """Move the target aside (if any), then rename the temp file into place.

        Without ``keep_backup`` (a change of one file: nothing else can fail after it) the temp
        file simply replaces the target — rename is atomic, and no backup needs deleting.
        """
        if self.existed and keep_backup:
            self.backup = _temp_name(self.name, "bak")
            _rename(self.name, self.backup, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        assert self.tmp is not None
        _rename(self.tmp, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        self.tmp = None

    def undo(self) -> None:
        if self.tmp is None:  # installed: take the new file out again
            with contextlib.suppress(OSError):
                os.unlink(self.name, dir_fd=self.dir_fd)
        if self.backup is not None:
            _rename(self.backup, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            self.backup = None

    def discard(self) -> None:
        """Remove every trace: temp file, backup, directories this change created."""
        for leftover in (self.tmp, self.backup):
            if leftover is not None:
                with contextlib.suppress(OSError):
                    os.unlink(leftover, dir_fd=self.dir_fd)
        self.tmp = self.backup = None
        os.close(self.dir_fd)
        for created in reversed(self.created):
            with contextlib.suppress(OSError):
                os.rmdir(created)


class _Deleted:
    """A file to delete: moved aside first, so a rollback can put it back."""

    def __init__(self, r: Resolved) -> None:
        self.r = r
        self.dir_fd, self.name, _ = open_parent(r, create=False)
        self.backup: str | None = None
        existing = _lstat_at(self.dir_fd, self.name)
        if existing is None or not stat.S_ISREG(existing.st_mode):
            os.close(self.dir_fd)
            raise FsError(NOT_FOUND if existing is None else NOT_REGULAR, r.given)
        self.created: list[str] = []

    def install(self, keep_backup: bool = True) -> None:
        self.backup = _temp_name(self.name, "bak")
        _rename(self.name, self.backup, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)

    def undo(self) -> None:
        if self.backup is not None:
            _rename(self.backup, self.name, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
            self.backup = None

    def discard(self) -> None:
        if self.backup is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.backup, dir_fd=self.dir_fd)
        os.close(self.dir_fd)


def _lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _temp_name(name: str, kind: str) -> str:
    return f".{name[:100]}.toolseam-{secrets.token_hex(6)}.{kind}"


class _LeafIsSymlink(Exception):
    pass


def write_file(base: str, path: str, confine: bool, data: bytes, keep_bom: bool = False
               ) -> dict[str, Any]:
    """Atomic write: temp file in the same dir, fsync, rename; an existing file keeps its mode
    (a read-only one is refused); with ``keep_bom``, its UTF-8 byte-order mark too."""
    if not confine:
        created = _write_unconfined(base, path, data, keep_bom)
        if created is not None:
            return {"bytes": len(data), "created": created}
    result = commit(base, confine, [{"op": "write", "path": path, "data": data,
                                     "keep_bom": keep_bom}])
    return {"bytes": len(data), "created": result["created"] == 1}


BOM = b"\xef\xbb\xbf"
_EUID = os.geteuid()  # fixed for the process's life: one syscall fewer per write


def _writable(st: os.stat_result) -> bool:
    """Whether the file's mode lets us write it in place. Root is held to the mode too: a
    0444 file says "do not change me", and an atomic rename would otherwise ignore it."""
    uid = _EUID
    if uid == 0:
        return bool(st.st_mode & 0o222)
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IWUSR)
    if st.st_gid in (os.getegid(), *os.getgroups()):
        return bool(st.st_mode & stat.S_IWGRP)
    return bool(st.st_mode & stat.S_IWOTH)


def _write_unconfined(base: str, path: str, data: bytes, keep_bom: bool) -> bool | None:
    """The common write in the fewest syscalls: unconfined, the kernel may resolve the parent
    as given (symlinks followed, as ``canonicalize`` would) — one open instead of an ``lstat``
    per component. None sends the caller the long way: a parent to create, a leaf that is a
    symlink (the target is written) or ``.``/``..``, or any error (reported from there)."""
    r = resolve(base, path, False, canonical_needed=False)
    parent, _, leaf = r.canonical.rpartition("/")
    if r.trailing_slash or leaf in ("", ".", ".."):
        return None
    try:
        dir_fd = os.open(parent or "/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        staged = _Staged(r, data, (dir_fd, leaf), keep_bom)
    except _LeafIsSymlink:
        return None
    except OSError as exc:
        raise from_os_error(exc, path) from None
    try:
        staged.install(keep_backup=False)
    except OSError as exc:
        staged.discard()
        raise from_os_error(exc, path) from None
    staged.discard()  # closes the dir fd: the temp file was renamed into place
    return not staged.existed


def _current_digest(r: Resolved) -> str | None:
    try:
        fd, _ = _open_regular(r)
    except FsError as exc:
        if exc.code == NOT_FOUND:
            return None
        raise
    with open(fd, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def commit(base: str, confine: bool, ops: list[dict[str, Any]]) -> dict[str, int]:
    """Apply writes and deletes all or nothing.

    Each op is ``{"op": "write", "path", "data", "expect"?}`` or ``{"op": "delete", "path",
    "expect"?}``; ``expect`` is ``"absent"`` or the sha256 of the content the caller based its
    change on, so a file changed behind the caller's back stops the whole commit. Everything is
    staged first (temp files beside their targets); then targets are swapped in one by one,
    and any failure puts back every file already swapped and removes every temp file, backup
    and directory the commit created.
    """
    resolved = [resolve(base, op["path"], confine) for op in ops]
    if len({r.canonical for r in resolved}) != len(resolved):
        raise FsError(INVALID, ops[0]["path"] if ops else "", "a path appears twice in one change")
    for op, r in zip(ops, resolved, strict=True):
        expect = op.get("expect")
        if expect is not None:
            digest = _current_digest(r)
            if (expect == "absent") != (digest is None) or (expect != "absent" and digest != expect):
                raise FsError(EXISTS if expect == "absent" else STALE, op["path"])
    staged: list[_Staged | _Deleted] = []
    installed: list[_Staged | _Deleted] = []
    current = ""  # the path being worked on, for the error message
    try:
        for op, r in zip(ops, resolved, strict=True):
            current = r.given
            staged.append(_Staged(r, op["data"], keep_bom=op.get("keep_bom", False),
                                  private=op.get("private", False))
                          if op["op"] == "write" else _Deleted(r))
        for item in staged:
            current = item.r.given
            installed.append(item)
            item.install(keep_backup=len(staged) > 1)
    except BaseException as exc:
        unrestored = _roll_back(installed)
        for item in staged:
            item.discard()
        if isinstance(exc, OSError):
            exc = from_os_error(exc, current)
        if unrestored and isinstance(exc, FsError):
            exc.detail += f"; could not restore {', '.join(unrestored)} (changed meanwhile)"
        raise exc from None
    created = sum(1 for s in staged if isinstance(s, _Staged) and not s.existed)
    for item in staged:
        item.created.clear()  # the new directories now hold the committed files
        item.discard()  # drops backups only: temp files were renamed into place
    return {"written": sum(isinstance(s, _Staged) for s in staged),
            "deleted": sum(isinstance(s, _Deleted) for s in staged), "created": created}


def _roll_back(installed: list[_Staged | _Deleted]) -> list[str]:
    """Undo in reverse order; every undo is tried. Returns the paths that could not be."""
    failed = []
    for item in reversed(installed):
        try:
            item.undo()
        except OSError:
            failed.append(item.r.given)
    return failed
