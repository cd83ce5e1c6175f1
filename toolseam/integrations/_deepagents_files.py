"""deepagents' read, edit and grep through toolseam's own file operations: the sandbox's agent
answers them directly (a line window, a byte read, an atomic compare-and-write, a search), so no
script runs in the sandbox and no output is parsed back. The answers are the ones
``BaseSandbox``'s shell-derived defaults give, error texts included."""

from __future__ import annotations

import base64
import hashlib
import posixpath
import re

from deepagents.backends.protocol import EditResult, FileData, GrepMatch, GrepResult, ReadResult
from deepagents.backends.utils import (
    EMPTY_CONTENT_WARNING,
    EMPTY_OLD_STRING_ERROR,
    compile_grep_include_glob,
    normalize_read_bounds,
)

from ..seam.errors import FileOpError
from ..seam.models import ChangeSet, PageRequest, PathRef, WriteOp
from ..session.toolkit import Toolkit

MAX_OUTPUT_BYTES = 500 * 1024  # deepagents' page and binary preview bounds
MAX_BINARY_BYTES = 500 * 1024
_READ_ERRORS = {"not_found": "file_not_found", "permission": "permission_denied",
                "is_directory": "not_a_file", "not_regular": "not_a_file"}
_EDIT_ERRORS = {"not_found": "Error: File '{path}' not found",
                "permission": "Error: Permission denied editing file '{path}'",
                "is_directory": "Error: '{path}' is not a regular file",
                "not_regular": "Error: '{path}' is not a regular file"}


async def read(tk: Toolkit, file_path: str, offset: int, limit: int) -> ReadResult:
    """A window of a text file's lines (0-based ``offset``), or a small binary file whole."""
    ref = PathRef(base=tk.base_dir, path=file_path)
    found = await tk.backend.stat(ref)
    if found.kind == "missing":
        return ReadResult(error=f"File '{file_path}': file_not_found")
    if found.kind != "file":
        return ReadResult(error=f"File '{file_path}': not_a_file")
    if found.size == 0:
        return ReadResult(file_data=FileData(content=EMPTY_CONTENT_WARNING, encoding="utf-8"))
    offset, limit = normalize_read_bounds(offset, limit)
    try:
        page = await tk.backend.read_page(ref, PageRequest(
            offset=offset + 1, limit=max(limit, 1), max_bytes=MAX_OUTPUT_BYTES,
            max_line_chars=MAX_OUTPUT_BYTES))
    except FileOpError as exc:
        if exc.code in ("binary", "not_utf8"):
            return await _read_binary(tk, ref, file_path, found.size)
        if exc.code == "past_end":
            return ReadResult(error=f"File '{file_path}': Line offset {offset} exceeds file "
                                    f"length ({exc.detail} lines)")
        return ReadResult(error=f"File '{file_path}': {_READ_ERRORS.get(exc.code, exc.code)}")
    if limit <= 0:  # asked after the checks above, as deepagents' own script does
        return ReadResult(file_data=FileData(content="", encoding="utf-8"),
                          no_lines_requested=True)
    if not page.lines:
        return ReadResult(error=f"File '{file_path}': Line offset {offset} exceeds file length "
                                f"({page.total or 0} lines)")
    end = offset + len(page.lines)
    return ReadResult(file_data=FileData(content="\n".join(page.lines), encoding="utf-8"),
                      total_lines=page.total, start_line=offset + 1, end_line=end,
                      next_offset=None if page.next is None else end)


async def _read_binary(tk: Toolkit, ref: PathRef, file_path: str, size: int) -> ReadResult:
    if size > MAX_BINARY_BYTES:
        return ReadResult(error=f"File '{file_path}': Binary file exceeds maximum preview size "
                                f"of {MAX_BINARY_BYTES} bytes")
    content = await tk.backend.read_bytes(ref, refuse_above_bytes=MAX_BINARY_BYTES)
    return ReadResult(file_data=FileData(content=base64.b64encode(content.data).decode("ascii"),
                                         encoding="base64"))


async def edit(tk: Toolkit, file_path: str, old: str, new: str, replace_all: bool) -> EditResult:
    """Replace ``old`` exactly (once, or every time with ``replace_all``); written atomically,
    and only if the file did not change since it was read. A CRLF file matches an LF
    ``old`` as deepagents' own edit does, keeping its line endings."""
    if not old:
        return EditResult(error=EMPTY_OLD_STRING_ERROR)
    ref = PathRef(base=tk.base_dir, path=file_path)
    try:
        content = await tk.backend.read_bytes(ref)
    except FileOpError as exc:
        return EditResult(error=_EDIT_ERRORS.get(exc.code, "Error editing file '{path}': {exc}")
                          .format(path=file_path, exc=exc))
    try:
        text = content.data.decode("utf-8")
    except UnicodeDecodeError:
        return EditResult(error=f"Error: File '{file_path}' is not a text file")
    if old not in text and "\r\n" in text and "\n" in old:
        old, new = (s.replace("\r\n", "\n").replace("\n", "\r\n") for s in (old, new))
    occurrences = text.count(old)
    if occurrences == 0:
        return EditResult(error=f"Error: String not found in file: '{old}'")
    if occurrences > 1 and not replace_all:
        return EditResult(error=f"Error: String '{old}' appears multiple times. Use "
                                "replace_all=True to replace all occurrences.")
    digest = hashlib.sha256(content.data).hexdigest()
    try:
        await tk.backend.commit(ChangeSet(base=tk.base_dir, ops=[WriteOp(
            path=file_path, data=text.replace(old, new).encode("utf-8"), expect=digest)]))
    except FileOpError as exc:
        reason = "it changed while being edited" if exc.code == "stale" else str(exc)
        return EditResult(error=f"Error editing file '{file_path}': {reason}")
    return EditResult(path=file_path, occurrences=occurrences)


async def grep(tk: Toolkit, pattern: str, path: str | None, glob: str | None,
               max_count: int | None, exclude_dirs: tuple[str, ...]) -> GrepResult:
    """Every line holding ``pattern`` literally, under ``path`` (a dir or a file)."""
    root = posixpath.normpath(posixpath.join(tk.base_dir, path or "."))
    try:
        found = await tk.backend.grep(PathRef(base=tk.base_dir, path=root), re.escape(pattern))
    except FileOpError as exc:
        return GrepResult(error=f"Path '{path or '.'}': {exc}")
    root_kind = (await tk.backend.stat(PathRef(base=tk.base_dir, path=root))).kind
    include = compile_grep_include_glob(glob) if glob else None
    skipped = set(exclude_dirs)
    matches: list[GrepMatch] = []
    for rel, line, text in sorted(found.hits):
        parts = rel.split("/")
        if skipped.intersection(parts[:-1]) or (include is not None and not include(rel)):
            continue
        absolute = root if root_kind == "file" else posixpath.join(root, rel)
        matches.append({"path": absolute, "line": line, "text": text})
    if max_count is not None and len(matches) > max_count:
        return GrepResult(matches=matches[:max_count], truncated=True)
    return GrepResult(matches=matches)
