"""Where an edit's oldString occurs, in linear time.

An oldString matches LF, CRLF and mixed files alike (each of its line breaks fits ``\\n`` or
``\\r\\n``). Written as a regex (``line\\r?\\nline…``) that search backtracks: a 2 000-line
oldString that misses on its last line against a 400 000-line file took 213 s, on the host
backend's event loop. Here both sides are searched with their CRLFs folded to LF by
``str.find``, which CPython runs in linear time for long needles (the two-way algorithm), and the
offsets are mapped back; a property test holds it to the regex's answers.

One deliberate difference: a lone ``\r`` at the very end of oldString is a character that
matches a lone ``\r`` in the file, never the ``\r`` of a CRLF (the regex let it, leaving the
line's ``\n`` behind as a bare LF) — decision 103.
"""

from __future__ import annotations

import bisect


def occurrences(text: str, old: str) -> list[tuple[int, int]]:
    """``(start, end)`` of each non-overlapping occurrence of ``old`` in ``text``, left to
    right — what ``re.finditer`` of ``old`` with every line break as ``\\r?\\n`` finds."""
    needle = old.replace("\r\n", "\n")
    if "\r\n" not in text:
        return _spans(text, needle)
    # In the folded text, each CRLF is one "\n": remember where, to map offsets back.
    folded_breaks: list[int] = []
    parts = text.split("\r\n")
    position = 0
    for part in parts[:-1]:
        position += len(part)
        folded_breaks.append(position)
        position += 1
    folded = "\n".join(parts)

    def original(offset: int) -> int:
        return offset + bisect.bisect_left(folded_breaks, offset)

    return [(original(start), original(end)) for start, end in _spans(folded, needle)]


def first_occurrence(text: str, old: str) -> int | None:
    """The start of the first occurrence, or None."""
    found = occurrences(text, old) if "\r\n" in text else _spans(text, old.replace("\r\n", "\n"), 1)
    return found[0][0] if found else None


def _spans(text: str, needle: str, most: int | None = None) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    if not needle:
        return spans
    at = text.find(needle)
    while at >= 0 and (most is None or len(spans) < most):
        spans.append((at, at + len(needle)))
        at = text.find(needle, at + len(needle))
    return spans
