"""The JSON-lines wire of ``serve --stdio``, hardened for clients that are buggy or hostile.

* ``read_lines``: lines of at most ``limit`` bytes; a longer line is skipped as it arrives (never
  held whole: a 1 GiB line costs one buffer of reading) and reported as ``Oversized``.
* ``deeper_than``: the depth of arrays and objects in a line, by a scan that does not recurse, so a
  line nested 100 000 deep is refused before ``json.loads`` would raise ``RecursionError``.
* ``loads``: strict JSON — ``NaN``, ``Infinity`` and ``-Infinity`` are not JSON and are refused.
* ``dumps``: strict JSON in valid UTF-8 — a lone surrogate (from a ``"\\ud800"`` escape, or a
  name with undecodable bytes) is written as its ``\\uXXXX`` escape, never as broken bytes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import operator
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

CHUNK = 1 << 20


@dataclass(frozen=True)
class Oversized:
    """A line longer than the limit: skipped, only its length kept (for the message)."""

    size: int


async def read_lines(reader: asyncio.StreamReader, limit: int) -> AsyncIterator[bytes | Oversized]:
    """Each line (without its newline) or ``Oversized``; a last line without a newline counts."""
    held = bytearray()
    skipped = -1  # bytes of the current line dropped so far; -1: the line is within the limit
    while True:
        chunk = await reader.read(CHUNK)
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = memoryview(chunk)[start:end if end >= 0 else len(chunk)]
            if skipped >= 0:
                skipped += len(piece)
            elif len(held) + len(piece) > limit:
                skipped = len(held) + len(piece)
                held = bytearray()  # give the memory back now, not at the newline
            else:
                held += piece
            if end < 0:
                break
            yield Oversized(skipped) if skipped >= 0 else bytes(held)
            held.clear()
            skipped = -1
            start = end + 1
        if not chunk:  # EOF
            if skipped >= 0:
                yield Oversized(skipped)
            elif held:
                yield bytes(held)
            return


# A JSON string, or an unterminated one running to the end of the line. Every '"' that starts a
# match therefore succeeds, so one pass is linear even on a line made of quotes and escapes.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")  # opener +1, closer -1, after a shift


def deeper_than(line: bytes, limit: int) -> bool:
    """Whether arrays and objects in ``line`` nest deeper than ``limit``; brackets inside
    strings do not count. Linear, and every loop is in C: no recursion, whatever the line."""
    if line.count(b"[") + line.count(b"{") <= limit:  # the common case: too few brackets at all
        return False
    brackets = _STRING.sub(b"", line).translate(None, _NOT_BRACKET)
    if brackets.count(b"[") + brackets.count(b"{") <= limit:
        return False
    # The usual attack, [[[[[…: a run of openers longer than the limit. Runs are matched only
    # from their first bracket (the lookbehind), so a line of runs just under it stays linear.
    if re.search(rb"(?<![\[{])[\[{]{%d}" % (limit + 1), brackets):
        return True
    # Peel the innermost pairs a few times (C speed; most lines collapse). In valid JSON each
    # pass lowers the deepest point by exactly one, so the limit drops by one per pass.
    peeled = 0
    while peeled < 4 and brackets:
        shorter = brackets.replace(b"[]", b"").replace(b"{}", b"")
        if len(shorter) == len(brackets):
            break
        brackets, peeled = shorter, peeled + 1
    if not brackets:
        return peeled > limit
    # depth after i+1 brackets = (2 per opener so far) - (i+1): prefix sums in C loops, about
    # 0.1 µs a bracket — only a line with more than ``limit`` brackets outside strings (no
    # real call has that many: tool arguments are strings and numbers) gets here
    depth: int = max(map(operator.sub, itertools.accumulate(brackets.translate(_STEP)),
                    itertools.count(1)))
    return depth + peeled > limit


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(line: bytes) -> Any:
    """Strict JSON: NaN and the infinities are refused (ValueError)."""
    return json.loads(line, parse_constant=_no_constants)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def dumps(message: dict[str, Any]) -> bytes:
    """One line of strict JSON in valid UTF-8, newline included."""
    try:
        text = json.dumps(message, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a non-finite float somewhere: JSON has no such number, null says so
        text = json.dumps(_finite(message), ensure_ascii=False, allow_nan=False)
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:  # a lone surrogate: the ASCII form escapes it as \udXXX
        return json.dumps(_finite(message), allow_nan=False).encode("ascii") + b"\n"
