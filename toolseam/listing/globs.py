"""Glob patterns: ``*``, ``?``, ``**`` (zero or more whole directories), ``[abc]``/``[!abc]``,
``{a,b}``; case-sensitive. A pattern without ``/`` matches the file name at any depth; one with
``/`` matches the path relative to the walk root. ``\\`` escapes the next character.

Hand-written because ``fnmatch`` has neither ``**`` nor braces and lets ``*`` cross ``/``.
"""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass


class GlobSyntaxError(ValueError):
    """The pattern cannot be compiled (names what is wrong)."""


_MAGIC = frozenset("*?[]{}\\")


@dataclass(frozen=True)
class CompiledGlob:
    pattern: str
    regex: str  # matched in full
    basename: bool  # match the file name, not the relative path
    # An exact shortcut: a name matches iff it ends with this (patterns like "*.py", "**/*.py").
    name_suffix: str | None = None

    def matches(self, rel: str) -> bool:
        subject = rel.rpartition("/")[2] if self.basename else rel
        return _compiled(self.regex).fullmatch(subject) is not None


@functools.lru_cache(maxsize=256)
def _compiled(regex: str) -> re.Pattern[str]:
    return re.compile(regex)


def compile_glob(pattern: str) -> CompiledGlob:
    if not pattern:
        raise GlobSyntaxError("pattern is empty")
    if pattern.startswith("/"):
        raise GlobSyntaxError("pattern must be relative; pass the directory as path")
    name_part = pattern
    # "**/X" with no other "/" is exactly "X" matched against the file name at any depth.
    while name_part.startswith("**/") and "/" not in name_part[3:].replace("**/", ""):
        name_part = name_part[3:]
    basename = "/" not in name_part
    effective = name_part if basename else pattern
    regex = _translate(effective)
    try:
        _compiled(regex)
    except re.error as exc:  # pragma: no cover - _translate escapes everything it emits
        raise GlobSyntaxError(f"cannot compile {pattern!r}: {exc}") from None
    suffix = None
    if basename and effective.startswith("*") and not _MAGIC & set(effective.lstrip("*")):
        suffix = effective.lstrip("*")
    return CompiledGlob(pattern, regex, basename, suffix)


def _translate(p: str, top: bool = True) -> str:
    out: list[str] = []
    i, n = 0, len(p)
    while i < n:
        c = p[i]
        if c == "*":
            if p.startswith("**", i) and (i == 0 or p[i - 1] == "/") and (i + 2 == n or p[i + 2] == "/"):
                if i + 2 == n:
                    out.append(".*")  # a trailing ** is everything below
                    i += 2
                else:
                    out.append("(?:[^/]+/)*")  # **/ is zero or more whole directories
                    i += 3
                continue
            while i < n and p[i] == "*":
                i += 1
            out.append("[^/]*")
            continue
        if c == "?":
            out.append("[^/]")
        elif c == "[":
            end, cls = _char_class(p, i)
            if end < 0:
                out.append(re.escape(c))
            else:
                out.append(cls)
                i = end
        elif c == "{":
            end = _closing_brace(p, i)
            if end < 0:
                out.append(re.escape(c))
            else:
                alternatives = _split_top_level(p[i + 1 : end])
                out.append("(?:" + "|".join(_translate(a, False) if a else "" for a in alternatives)
                           + ")")
                i = end
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(p[i]))
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(_commit_stars(out) if top else out)


_STAR = "[^/]*"


def _commit_stars(tokens: list[str]) -> list[str]:
    """``*a*a*a*ab`` against a long name backtracks exponentially (20 s on the host's loop for
    11 characters). Within one path component a star followed by a fixed-length chunk and
    another star may take the chunk's first occurrence and never look back — the rule
    CPython's fnmatch applies with atomic groups. It holds only where every token is of fixed
    length and none but the separators can match ``/`` (a subject component is then exactly a
    pattern segment), so patterns with ``**`` or braces are left as they are."""
    if any(t.startswith("(?") or t == ".*" or (t != "/" and t != _STAR and re.fullmatch(t, "/"))
           for t in tokens):
        return tokens
    result: list[str] = []
    segment: list[str] = []
    for token in [*tokens, None]:
        if token is None or token == "/":
            stars = [k for k, t in enumerate(segment) if t == _STAR]
            for here, nxt in itertools.pairwise(stars):
                segment[here] = "(?>[^/]*?" + "".join(segment[here + 1:nxt]) + ")"
                for k in range(here + 1, nxt):
                    segment[k] = ""
            result += [t for t in segment if t]
            if token is not None:
                result.append(token)
            segment = []
        else:
            segment.append(token)
    return result


def _char_class(p: str, start: int) -> tuple[int, str]:
    """(index of the closing ``]``, regex class) or (-1, "") when unterminated."""
    j = start + 1
    negate = j < len(p) and p[j] in "!^"
    if negate:
        j += 1
    body_start = j
    if j < len(p) and p[j] == "]":
        j += 1  # a leading ] is literal
    while j < len(p) and p[j] != "]":
        j += 1
    if j >= len(p):
        return -1, ""
    body = p[body_start:j]
    parts: list[str] = []
    for k, ch in enumerate(body):
        if ch == "-" and 0 < k < len(body) - 1:
            parts.append("-")
        else:
            parts.append(re.escape(ch))
    return j, "[" + ("^/" if negate else "") + "".join(parts) + "]"


def _closing_brace(p: str, start: int) -> int:
    depth = 0
    for k in range(start, len(p)):
        if p[k] == "\\":
            continue
        if p[k] == "{":
            depth += 1
        elif p[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return -1


def _split_top_level(body: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in body:
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        depth += ch == "{"
        depth -= ch == "}"
        current.append(ch)
    parts.append("".join(current))
    return parts
