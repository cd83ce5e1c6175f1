"""Why an edit or a patch hunk did not match, in words a model can act on.

Most failed edits are near misses: the model's memory of the file differs in indentation, a
quote, one renamed word, or the change is already there. The diagnosis finds the place in the
file the model most likely meant (the alignment where the most of its lines match, compared
loosely), names the first line that differs there and how it differs, and notices when the
new text is already in the file. Pure: no I/O.
"""

from __future__ import annotations

import difflib
import re
import string
from collections import Counter, defaultdict
from dataclasses import dataclass

# Typographic characters models type for their ASCII forms (the same set patch.py reads as
# equal when it matches hunks).
_TYPOGRAPHIC = str.maketrans({
    **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
    **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
    **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
    **dict.fromkeys("\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000",
                    " "),
})
_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}]")
_CLOSE_SEARCH_LINES = 20_000  # a fuzzy search of one line over more than this is not worth it
_SHOWN = 120  # characters of a line quoted in a diagnosis
# Bounds that keep a diagnosis linear in the file, whatever the input (a model's near miss of
# 2 000 identical lines against a file of 400 000 cast 800 million votes):
_VOTES = 2_000_000  # (wanted line, file line) pairs voted on; the rarest wanted lines vote first
_WORDS = 2_000  # longer lines are not word-diffed (difflib is quadratic)
_FUZZY_CHARS = 400  # of each line, in the fuzzy search for a line


def loose(line: str) -> str:
    """A line compared loosely: spacing collapsed, typographic punctuation as ASCII."""
    return " ".join(line.translate(_TYPOGRAPHIC).split())


def difference(wanted: str, found: str) -> str:
    """The kind of difference between a line as given and the file's line."""
    if wanted == found:
        return "identical"
    if "".join(wanted.split()) == "".join(found.split()):
        return "whitespace only (indentation or spacing)"
    if loose(wanted) == loose(found):
        return "typographic punctuation (quotes, dashes or spaces)"
    if _PUNCTUATION.sub("", loose(wanted)) == _PUNCTUATION.sub("", loose(found)):
        return "punctuation"
    old_words, new_words = wanted.split(), found.split()
    if len(old_words) + len(new_words) > _WORDS:
        return "different text"
    changes = [op for op in difflib.SequenceMatcher(a=old_words, b=new_words, autojunk=False)
               .get_opcodes() if op[0] != "equal"]
    if len(changes) == 1:
        tag, a1, a2, b1, b2 = changes[0]
        given, there = " ".join(old_words[a1:a2]), " ".join(new_words[b1:b2])
        if tag == "replace":
            return f"a changed word: {_clip(given)!r} where the file has {_clip(there)!r}"
        if tag == "delete":
            return f"extra words: {_clip(given)!r} is not in the file's line"
        return f"missing words: the file's line also has {_clip(there)!r}"
    return "different text"


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN else text[:_SHOWN - 1] + "…"


@dataclass(frozen=True)
class Candidate:
    """The wanted lines laid over the file at index ``at`` (may start before the file)."""

    at: int
    matched: int  # wanted lines that match loosely there


def closest(lines: list[str], wanted: list[str], start: int = 0) -> Candidate | None:
    """Where ``wanted`` best fits ``lines``: the offset where the most wanted lines match
    loosely (blank lines do not vote), the first such offset at or after ``start`` on a tie."""
    index: defaultdict[str, list[int]] = defaultdict(list)
    keys = {loose(w) for w in wanted if w.strip()}
    for number, line in enumerate(lines):
        key = loose(line)
        if key in keys:
            index[key].append(number)
    votes: Counter[int] = Counter()
    voters = sorted(((len(index.get(loose(w), ())), j) for j, w in enumerate(wanted)
                     if w.strip()))
    cast = 0
    for count, j in voters:  # the rarest lines say the most about where the text is
        if cast and cast + count > _VOTES:
            break
        cast += count
        for number in index.get(loose(wanted[j]), ()):
            votes[number - j] += 1
    if votes:
        best = max(votes.values())
        ties = sorted(at for at, n in votes.items() if n == best)
        after = [at for at in ties if at >= start]
        return Candidate(after[0] if after else ties[0], best)
    return None


def mismatch_notes(lines: list[str], wanted: list[str], start: int, what: str) -> list[str]:
    """Sentences on where ``wanted`` (``what``: "the hunk", "oldString") nearly fits."""
    candidate = closest(lines, wanted, start)
    if candidate is not None:
        for j, w in enumerate(wanted):
            k = candidate.at + j
            there = lines[k] if 0 <= k < len(lines) else None
            if there != w:
                where = (f"file line {k + 1}: {_clip(there)!r}" if there is not None
                         else "the end of the file" if k >= len(lines) else "the start of the file")
                kind = difference(w, there) if there is not None else "the file ends first"
                notes = [f"First line of {what} that does not match: its line {j + 1}, "
                         f"{_clip(w)!r}. Closest candidate: {where} — {kind}."]
                if candidate.at < start:
                    notes.append(f"(that place, line {candidate.at + 1}, is before the previous "
                                 "hunk: hunks must come in file order)")
                return notes
        return []
    first = next((w for w in wanted if w.strip()), None)
    if first is None or len(lines) > _CLOSE_SEARCH_LINES:
        return [f"No line of {what} was found in the file; read the file again."]
    stripped = [line.strip()[:_FUZZY_CHARS] for line in lines]
    close = difflib.get_close_matches(first.strip()[:_FUZZY_CHARS], stripped, n=1, cutoff=0.6)
    if not close:
        return [f"No line of {what} is in the file, nor anything close to {_clip(first)!r}; "
                "read the file again."]
    k = stripped.index(close[0])
    return [f"No line of {what} is in the file. The closest to its first line {_clip(first)!r} "
            f"is file line {k + 1}: {_clip(lines[k])!r} — {difference(first, lines[k])}."]


def find_block(lines: list[str], block: list[str]) -> int | None:
    """The first index where ``block`` occurs exactly in ``lines``, or None."""
    if not block:
        return None
    first = block[0]
    for at in range(len(lines) - len(block) + 1):
        if lines[at] == first and lines[at:at + len(block)] == block:
            return at
    return None
