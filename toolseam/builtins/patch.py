"""The apply_patch grammar, parsed and applied in memory. Pure: no I/O.

::

    *** Begin Patch
    *** Add File: path          then lines starting with "+"
    *** Update File: path       then optionally "*** Move to: new-path", then hunks:
    @@ optional context line    a hunk header (several in a row narrow the place step by
                                step); " " context, "-" removed, "+" added lines
    *** End of File             the hunk must end at the end of the file
    *** Delete File: path
    *** End Patch

As lenient as codex's apply_patch where codex is lenient: a heredoc wrapper
(``apply_patch <<'EOF' … EOF``, ``cat <<EOF``) is taken off, markers may be padded with
whitespace, blank lines before ``*** End Patch`` are ignored, and a hunk is found by its old
lines (context + removed) at or after the previous hunk with the strictest comparison that
matches: exactly, then ignoring trailing whitespace, then surrounding whitespace, then with
Unicode dashes, quotes and spaces read as their ASCII forms. A hunk with no old lines and no
header is appended at the end of the file as it was before the patch (codex places every hunk
against the original lines), so hunks after it are still found. Updated files end with a
newline, as codex writes them; each line keeps its file's line ending (CRLF stays CRLF).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ._diagnose import mismatch_notes


class PatchError(ValueError):
    """The patch is malformed or does not fit the files (message says where)."""

    def __init__(self, message: str, notes: list[str] | None = None) -> None:
        super().__init__(message)
        self.notes = notes or []  # for the model: the near miss, "already applied"


@dataclass
class Hunk:
    contexts: list[str] = field(default_factory=list)  # "@@ text" headers, narrowing in order
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
# The opening line of a shell heredoc: `apply_patch <<'EOF'`, `cat <<"PATCH"`, `<<EOF`.
_HEREDOC = re.compile(r"^(?:.*\s)?<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1\s*$")


@dataclass(frozen=True)
class _Line:
    number: int  # 1-based, in the text as given
    text: str  # without its line ending
    crlf: bool


def _marker(line: _Line) -> re.Match[str] | None:
    return _MARKER.match(line.text.strip())


def _unwrap(lines: list[_Line]) -> list[_Line]:
    """Blank lines off both ends, then a heredoc wrapper whose closing word ends the text."""
    while lines and not lines[-1].text.strip():
        lines.pop()
    while lines and not lines[0].text.strip():
        lines.pop(0)
    if len(lines) >= 2:
        opening = _HEREDOC.match(lines[0].text.strip())
        if opening and lines[-1].text.strip() == opening.group(2):
            return _unwrap(lines[1:-1])
    return lines


def parse_patch(text: str) -> list[FileOp]:
    raw = text.split("\n")
    lines = _unwrap([_Line(n, s.removesuffix("\r"), s.endswith("\r")) for n, s in enumerate(raw, 1)])
    if not lines or lines[0].text.strip() != "*** Begin Patch":
        raise PatchError("the patch must start with '*** Begin Patch'")
    if len(lines) < 2 or lines[-1].text.strip() != "*** End Patch":
        raise PatchError("the patch must end with '*** End Patch'")
    body = lines[1:-1]
    ops: list[FileOp] = []
    i = 0
    while i < len(body):
        match = _marker(body[i])
        if not match:
            if not body[i].text.strip():
                i += 1
                continue
            raise PatchError(f"line {body[i].number}: expected '*** Add/Update/Delete File:', "
                             f"got {body[i].text!r}")
        kind, path = match.group(1).lower(), match.group(2).strip()
        if not path:
            raise PatchError(f"line {body[i].number}: a file operation needs a path")
        i += 1
        section: list[_Line] = []
        while i < len(body) and not _marker(body[i]):
            section.append(body[i])
            i += 1
        while section and not section[-1].text.strip():
            section.pop()  # a blank line before the next marker or *** End Patch
        ops.append(_section(kind, path, section))
    if not ops:
        raise PatchError("the patch has no file operations")
    return ops


def _section(kind: str, path: str, lines: list[_Line]) -> FileOp:
    if kind == "delete":
        if lines:
            raise PatchError(f"Delete File: {path} takes no lines")
        return FileOp("delete", path)
    if kind == "add":
        bad = [line.text for line in lines if not line.text.startswith("+")]
        if bad:
            raise PatchError(f"Add File: {path}: every line must start with '+', got {bad[0]!r}")
        # Each "+" line is a line of the file, ended as the patch ended it.
        return FileOp("add", path, content="".join(
            line.text[1:] + ("\r\n" if line.crlf else "\n") for line in lines))
    op = FileOp("update", path)
    if lines and lines[0].text.strip().startswith("*** Move to:"):
        op.move_to = lines.pop(0).text.strip().removeprefix("*** Move to:").strip()
        if not op.move_to:
            raise PatchError(f"Update File: {path}: '*** Move to:' needs a path")
    hunk: Hunk | None = None
    for line in lines:
        stripped = line.text.strip()
        if stripped == "@@" or line.text.lstrip().startswith("@@ "):
            if hunk is None or hunk.old or hunk.new or hunk.at_eof:
                hunk = Hunk()
                op.hunks.append(hunk)
            if stripped != "@@":
                hunk.contexts.append(line.text.lstrip()[3:])
            continue
        if stripped == "*** End of File":
            if hunk is None or not (hunk.old or hunk.new):
                raise PatchError(f"Update File: {path}: line {line.number}: '*** End of File' "
                                 "ends a hunk that has no lines")
            hunk.at_eof = True
            continue
        if hunk is not None and hunk.at_eof and not stripped:
            continue  # a blank line after *** End of File
        if hunk is None or hunk.at_eof:
            hunk = Hunk()
            op.hunks.append(hunk)
        text = line.text
        tag, rest = (text[:1], text[1:]) if text else (" ", "")
        if tag == " ":
            hunk.old.append(rest)
            hunk.new.append(rest)
        elif tag == "-":
            hunk.old.append(rest)
        elif tag == "+":
            hunk.new.append(rest)
        else:
            raise PatchError(f"Update File: {path}: line {line.number}: a hunk line must start "
                             f"with ' ', '-' or '+', got {text!r}")
    for number, h in enumerate(op.hunks, 1):
        if not (h.old or h.new):
            raise PatchError(f"Update File: {path}: hunk {number} ('@@') has no lines")
    if not op.hunks and op.move_to is None:
        raise PatchError(f"Update File: {path} has no hunks")
    return op


_EOL = re.compile(r"\r\n|\n")


def apply_hunks(content: str, hunks: list[Hunk], path: str) -> str:
    texts, endings = _split_lines(content)
    eol = "\r\n" if endings.count("\r\n") > endings.count("\n") else "\n"
    # Every search starts at the cursor, and past the cursor the edited lines are still the
    # original's, shifted by ``shift``: so the original is searched (its encodings made once).
    original = _Lines(list(texts))
    cursor = shift = 0

    def seek(wanted: list[str], at_eof: bool) -> int:
        at = original.seek(wanted, cursor - shift, at_eof)
        return at if at < 0 else at + shift

    appended: list[str] = []
    for number, hunk in enumerate(hunks, 1):
        for context in hunk.contexts:
            found = seek([context], False)
            if found < 0:
                raise PatchError(f"{path}: hunk {number}: context {context!r} not found",
                                 mismatch_notes(texts, [context], cursor, "the @@ header"))
            cursor = found + 1
        old, new = hunk.old, hunk.new
        if not old and not hunk.contexts:
            # codex: a bare addition goes at the end of the ORIGINAL file — codex places every
            # hunk against the original lines, so a later hunk is still found before it.
            appended += new
            continue
        if not old:
            at = cursor
        else:
            at = seek(old, hunk.at_eof)
            if at < 0 and old[-1] == "":
                # The patch's last context line stood for the file's final newline (as codex).
                old, new = old[:-1], new[:-1] if new and new[-1] == "" else new
                at = seek(old, hunk.at_eof) if old else -1
            if at < 0:
                shown = "\n".join(hunk.old)
                raise PatchError(f"{path}: hunk {number} does not match the file; expected:\n{shown}",
                                 _hunk_notes(texts, hunk, cursor))
        texts[at : at + len(old)] = new
        endings[at : at + len(old)] = [eol] * len(new)
        cursor = at + len(new)
        shift += len(new) - len(old)
    texts += appended
    endings += [eol] * len(appended)
    # Every line ends with a line ending, the last included (as codex writes files).
    return "".join(t + (e or eol) for t, e in zip(texts, endings, strict=True))


def _hunk_notes(texts: list[str], hunk: Hunk, cursor: int) -> list[str]:
    """Why the hunk did not fit: already applied, or its nearest miss."""
    new = [line for line in hunk.new]
    while new and new[-1] == "":
        new.pop()
    if new and new != hunk.old:
        at = _Lines(texts).seek(new, 0, False)
        if at >= 0:
            return [f"This hunk looks already applied: its new lines are in the file at line "
                    f"{at + 1}, its old lines are not. Read the file and skip this change."]
    return mismatch_notes(texts, hunk.old, cursor, "the hunk")


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


# Typographic characters models type for their ASCII forms (codex normalises the same set).
_PUNCTUATION = str.maketrans({
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
    **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
    **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
    **dict.fromkeys("\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000",
                    " "),
})


def _ascii_punctuation(s: str) -> str:
    return s.strip().translate(_PUNCTUATION)


_LADDER: tuple[Callable[[str], str], ...] = (str, str.rstrip, str.strip, _ascii_punctuation)


class _Lines:
    """A file's lines, searched for a run of lines in linear time at each step of the ladder.

    Codex compares line by line at every offset (``O(lines x hunk)``): a 2 000-line hunk that
    misses on its last line against 400 000 identical lines ran for minutes. Here each step
    gives every distinct (normalised) line an id and writes the file as a byte string of
    fixed-width tokens — ``0xff`` then the id in base 255, so a token can only begin at a
    token's start — and ``bytes.find`` (two-way: linear) does the search."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self._steps: dict[int, tuple[dict[str, int], int, bytes]] = {}

    def _encoded(self, step: int) -> tuple[dict[str, int], int, bytes]:
        if step not in self._steps:
            normalise = _LADDER[step]
            ids: dict[str, int] = {}
            numbers = [ids.setdefault(normalise(t), len(ids)) for t in self.texts]
            width = 3 if len(ids) < 255 ** 3 else 4
            tokens = [_token(n, width) for n in range(len(ids))]
            self._steps[step] = (ids, width, b"".join([tokens[n] for n in numbers]))
        return self._steps[step]

    def seek(self, wanted: list[str], start: int, at_eof: bool) -> int:
        """First index >= start where ``wanted`` matches, strictest comparison first."""
        n = len(wanted)
        if start < 0 or start + n > len(self.texts):
            return -1
        for step, normalise in enumerate(_LADDER):
            if at_eof:
                at = len(self.texts) - n
                if [normalise(t) for t in self.texts[at:]] == [normalise(w) for w in wanted]:
                    return at
                continue
            ids, width, encoded = self._encoded(step)
            try:
                target = b"".join(_token(ids[normalise(w)], width) for w in wanted)
            except KeyError:  # a line the file does not have at this step
                continue
            found = encoded.find(target, start * (width + 1))
            if found >= 0:
                return found // (width + 1)
        return -1


def _token(number: int, width: int) -> bytes:
    digits = []
    for _ in range(width):
        number, digit = divmod(number, 255)
        digits.append(digit)
    return bytes([0xFF, *reversed(digits)])
