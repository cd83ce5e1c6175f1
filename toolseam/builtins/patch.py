"""The apply_patch grammar, parsed and applied in memory. Pure: no I/O.

::

    *** Begin Patch
    *** Add File: path          then lines starting with "+"
    *** Update File: path       then optionally "*** Move to: new-path", then hunks:
    @@ optional context line    a hunk header; " " context, "-" removed, "+" added lines
    *** End of File             the hunk must end at the end of the file
    *** Delete File: path
    *** End Patch

A hunk is found by its old lines (context + removed) at or after the previous hunk, exactly
first, then ignoring trailing whitespace, then ignoring surrounding whitespace. Lines keep
their file's line ending; a file without a final newline keeps lacking one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


class PatchError(ValueError):
    """The patch is malformed or does not fit the files (message says where)."""


@dataclass
class Hunk:
    header: str
    old: list[str] = field(default_factory=list)
    new: list[str] = field(default_factory=list)
    at_eof: bool = False


@dataclass
class FileOp:
    kind: str  # add | update | delete
    path: str
    content: str = ""  # add
    move_to: str | None = None  # update
    hunks: list[Hunk] = field(default_factory=list)


_MARKER = re.compile(r"^\*\*\* (Add|Update|Delete) File: (.*)$")


def parse_patch(text: str) -> list[FileOp]:
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    while lines and not lines[-1].strip():
        lines.pop()
    start = 0
    while start < len(lines) and not lines[start].strip():
        start += 1
    if start >= len(lines) or lines[start].strip() != "*** Begin Patch":
        raise PatchError("the patch must start with '*** Begin Patch'")
    if lines[-1].strip() != "*** End Patch":
        raise PatchError("the patch must end with '*** End Patch'")
    body = lines[start + 1 : -1]
    ops: list[FileOp] = []
    i = 0
    while i < len(body):
        match = _MARKER.match(body[i])
        if not match:
            if not body[i].strip():
                i += 1
                continue
            raise PatchError(f"line {start + i + 2}: expected '*** Add/Update/Delete File:', got {body[i]!r}")
        kind, path = match.group(1).lower(), match.group(2).strip()
        if not path:
            raise PatchError(f"line {start + i + 2}: a file operation needs a path")
        i += 1
        section: list[str] = []
        while i < len(body) and not _MARKER.match(body[i]):
            section.append(body[i])
            i += 1
        ops.append(_section(kind, path, section))
    if not ops:
        raise PatchError("the patch has no file operations")
    return ops


def _section(kind: str, path: str, lines: list[str]) -> FileOp:
    if kind == "delete":
        if any(line.strip() for line in lines):
            raise PatchError(f"Delete File: {path} takes no lines")
        return FileOp("delete", path)
    if kind == "add":
        bad = [line for line in lines if not line.startswith("+")]
        if bad:
            raise PatchError(f"Add File: {path}: every line must start with '+', got {bad[0]!r}")
        return FileOp("add", path, content="".join(line[1:] + "\n" for line in lines))
    op = FileOp("update", path)
    if lines and lines[0].startswith("*** Move to:"):
        op.move_to = lines.pop(0).removeprefix("*** Move to:").strip()
        if not op.move_to:
            raise PatchError(f"Update File: {path}: '*** Move to:' needs a path")
    hunk: Hunk | None = None
    for line in lines:
        if line.startswith("@@"):
            hunk = Hunk(line[2:].strip())
            op.hunks.append(hunk)
            continue
        if line == "*** End of File":
            if hunk is None:
                raise PatchError(f"Update File: {path}: '*** End of File' outside a hunk")
            hunk.at_eof = True
            continue
        if hunk is None:
            hunk = Hunk("")
            op.hunks.append(hunk)
        tag, rest = (line[:1], line[1:]) if line else (" ", "")
        if tag == " ":
            hunk.old.append(rest)
            hunk.new.append(rest)
        elif tag == "-":
            hunk.old.append(rest)
        elif tag == "+":
            hunk.new.append(rest)
        else:
            raise PatchError(
                f"Update File: {path}: a hunk line must start with ' ', '-' or '+', got {line!r}")
    if not op.hunks and op.move_to is None:
        raise PatchError(f"Update File: {path} has no hunks")
    return op


_EOL = re.compile(r"\r\n|\n")


def apply_hunks(content: str, hunks: list[Hunk], path: str) -> str:
    texts, endings = _split_lines(content)
    eol = "\r\n" if endings.count("\r\n") > endings.count("\n") else "\n"
    lacks_final_eol = bool(endings) and endings[-1] == ""
    cursor = 0
    for number, hunk in enumerate(hunks, 1):
        if hunk.header:
            found = _seek(texts, [hunk.header], cursor, False)
            if found < 0:
                raise PatchError(f"{path}: hunk {number}: context {hunk.header!r} not found")
            cursor = found + 1
        if not hunk.old:
            at = cursor if hunk.header else len(texts)
        else:
            at = _seek(texts, hunk.old, cursor, hunk.at_eof)
            if at < 0:
                shown = "\n".join(hunk.old)
                raise PatchError(f"{path}: hunk {number} does not match the file; expected:\n{shown}")
        texts[at : at + len(hunk.old)] = hunk.new
        endings[at : at + len(hunk.old)] = [eol] * len(hunk.new)
        cursor = at + len(hunk.new)
    # Only the last line may lack an ending, and only if it lacked one before.
    endings = [e or eol for e in endings]
    if endings and lacks_final_eol:
        endings[-1] = ""
    return "".join(t + e for t, e in zip(texts, endings, strict=True))


def _split_lines(content: str) -> tuple[list[str], list[str]]:
    texts, endings = [], []
    pos = 0
    for match in _EOL.finditer(content):
        texts.append(content[pos : match.start()])
        endings.append(match.group())
        pos = match.end()
    if pos < len(content):
        texts.append(content[pos:])
        endings.append("")
    return texts, endings


def _seek(texts: list[str], wanted: list[str], start: int, at_eof: bool) -> int:
    """First index >= start where ``wanted`` matches, strictest comparison first."""
    n = len(wanted)
    for normalise in (lambda s: s, str.rstrip, str.strip):
        target = [normalise(w) for w in wanted]
        if at_eof:
            at = len(texts) - n
            if at >= start and [normalise(t) for t in texts[at:]] == target:
                return at
            continue
        for at in range(start, len(texts) - n + 1):
            if all(normalise(texts[at + k]) == target[k] for k in range(n)):
                return at
    return -1
