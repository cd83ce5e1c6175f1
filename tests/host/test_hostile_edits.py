"""edit and apply_patch find their text in linear time, whatever a model sends: the regex
oldString search, the line-by-line hunk search and the near-miss diagnosis were quadratic
(213 s for one edit, minutes for one patch, on the host's event loop)."""

from __future__ import annotations

import re
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from toolseam import Toolkit
from toolseam.builtins._occurrences import first_occurrence, occurrences
from toolseam.builtins.patch import _LADDER, _Lines


def _regex_spans(text: str, old: str) -> list[tuple[int, int]]:
    """The former search: every line break of ``old`` as ``\\r?\\n``."""
    lines = old.replace("\r\n", "\n").split("\n")
    pattern = re.compile("\r?\n".join(re.escape(line) for line in lines))
    return [(m.start(), m.end()) for m in pattern.finditer(text)]


_TEXT = st.text("ab\r\n", max_size=40)


@given(_TEXT, _TEXT.filter(lambda old: old != "" and not old.replace("\r\n", "\n").endswith("\r")))
def test_occurrences_are_the_regex_search(text: str, old: str) -> None:
    assert occurrences(text, old) == _regex_spans(text, old)
    spans = _regex_spans(text, old)
    assert first_occurrence(text, old) == (spans[0][0] if spans else None)


def test_a_trailing_lone_cr_never_takes_half_a_crlf() -> None:
    """Decision 103: the regex let ``"a\\r"`` eat the CR of a CRLF and leave a bare LF."""
    assert _regex_spans("a\r\nb", "a\r") == [(0, 2)]
    assert occurrences("a\r\nb", "a\r") == []
    assert occurrences("a\rb", "a\r") == [(0, 2)]


def _reference_seek(texts: list[str], wanted: list[str], start: int, at_eof: bool) -> int:
    """codex's search: every offset, each step of the ladder in turn."""
    n = len(wanted)
    for normalise in _LADDER:
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


_LINE = st.sampled_from(["x", "x ", " x", "y", "", "\u201cq\u201d", '"q"', "a\u2013b", "a-b"])


@given(st.lists(_LINE, max_size=14), st.lists(_LINE, min_size=1, max_size=4),
       st.integers(0, 15), st.booleans())
def test_the_linear_hunk_search_finds_what_codex_finds(texts: list[str], wanted: list[str],
                                                       start: int, at_eof: bool) -> None:
    assert _Lines(texts).seek(wanted, start, at_eof) == _reference_seek(texts, wanted, start,
                                                                         at_eof)


async def test_a_near_miss_of_many_identical_lines_is_answered_at_once(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x\n" * 200_000)
    near_miss = "x\n" * 1000 + "y\n"
    patch = ("*** Begin Patch\n*** Update File: f\n@@\n" + " x\n" * 1000 + "-y\n+z\n"
             "*** End Patch")
    async with Toolkit("host", base_dir=tmp_path) as tools:
        started = time.monotonic()
        edited = await tools.call("edit", {"path": "f", "oldString": near_miss, "newString": "z"})
        edit_s = time.monotonic() - started
        started = time.monotonic()
        patched = await tools.call("apply_patch", {"patchText": patch})
        patch_s = time.monotonic() - started
    assert edited.is_error and edited.output == "edit: oldString not found in f"
    assert patched.is_error and "hunk 1 does not match the file" in patched.output
    assert (tmp_path / "f").read_text() == "x\n" * 200_000
    # before: ~50 s and several minutes (quadratic); now well under a second each
    assert edit_s < 20 and patch_s < 20, (edit_s, patch_s)
