"""The JSON-lines wire of ``serve --stdio``, hardened for clients that are buggy or hostile.

* ``read_lines``: lines of at most ``limit`` bytes; a longer line is skipped as it arrives (held
  up to ``limit`` bytes, then dropped: a 1 GiB line never costs more) and reported as
  ``Oversized``.
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
_ONE_KIND = bytes.maketrans(b"{}", b"[]")  # in valid JSON kinds match; depth is the same
_OPEN_RUNS = re.compile(rb"\[+")
_CLOSE_RUNS = re.compile(rb"\]+")


def deeper_than(line: bytes, limit: int) -> bool:
    """Whether arrays and objects in ``line`` nest deeper than ``limit``; brackets inside
    strings do not count. Linear, and every loop is in C: no recursion, whatever the line."""
    if line.count(b"[") + line.count(b"{") <= limit:  # the common case: too few brackets at all
        return False
    brackets = _STRING.sub(b"", line).translate(_ONE_KIND, _NOT_BRACKET)
    if brackets.count(b"[") <= limit:
        return False
    # Peel the innermost pairs while that shrinks the line by an eighth or more (each pass is
    # one C loop; a pass lowers the deepest point by exactly one, as every deepest point sits
    # inside an innermost pair). What is left has few runs of brackets: walk those.
    peeled = 0
    while brackets:
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            break
        slow = len(shorter) * 8 > len(brackets) * 7  # it shrank by less than an eighth
        brackets, peeled = shorter, peeled + 1
        if peeled > limit:
            return True
        if slow:
            break
    return _deepest(brackets) + peeled > limit


def _deepest(brackets: bytes) -> int:
    """The deepest point of a run of '[' and ']', from the lengths of its runs (C loops over
    runs, not brackets): after the k-th run of openers the depth is the openers so far minus
    the closers before them."""
    openers = map(len, _OPEN_RUNS.findall(brackets))
    closers = itertools.accumulate(map(len, _CLOSE_RUNS.findall(brackets)))
    before = closers if brackets.startswith(b"]") else itertools.chain((0,), closers)
    return max(map(operator.sub, itertools.accumulate(openers), before), default=0)


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
