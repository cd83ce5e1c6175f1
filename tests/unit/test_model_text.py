"""The model-text renderer (``ToolResult.model_text``): the budget, cut markers on line
boundaries, the capture's head/tail join, notes — as a space of inputs (hypothesis) and on the
cases that used to mislead a model."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam import ToolResult
from toolseam.model_text import Gap, ModelHints, mark_gaps, render
from toolseam.seam.models import CaptureGap
from toolseam_agent.capture import OutputCapture

MARK = re.compile(r"\[… [^\n]*?…\]")

lines = st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"),
                         max_size=300), max_size=400)


@settings(max_examples=150, deadline=None)
@given(body=lines, trailing=st.booleans(), budget=st.integers(1000, 40_000),
       notes=st.lists(st.text(max_size=12_000), max_size=4), spill=st.booleans())
def test_never_over_budget_and_a_cut_is_always_marked(
        body: list[str], trailing: bool, budget: int, notes: list[str], spill: bool) -> None:
    output = "\n".join(body) + ("\n" if trailing and body else "")
    hints = ModelHints(budget=budget, notes=notes, spill="/tmp/x.txt" if spill else None)
    text = render(output, hints)
    assert len(text) <= budget
    joined = "\n".join(notes)
    gap = "" if not output or not joined else "\n" if output.endswith("\n") else "\n\n"
    whole = output + gap + joined
    if len(whole) <= budget:
        assert text == whole  # nothing to cut: nothing changed
    else:
        assert "[…" in text and "…]" in text
        if spill and output and len(output) > budget:
            assert "/tmp/x.txt" in text


@settings(max_examples=100, deadline=None)
@given(body=st.lists(st.from_regex(r"[a-z0-9 ]{0,200}", fullmatch=True), min_size=1,
                     max_size=2000), budget=st.integers(1000, 20_000))
def test_a_cut_keeps_whole_lines_and_counts_what_it_left_out(body: list[str], budget: int
                                                            ) -> None:
    numbered = [f"{n}:{line}" for n, line in enumerate(body, 1)]
    output = "\n".join(numbered) + "\n"
    text = render(output, ModelHints(budget=budget))
    if len(output) <= budget:
        assert text == output
        return
    kept = [line for line in text.split("\n") if line and not MARK.fullmatch(line)]
    assert set(kept) <= set(numbered)  # every shown line is a whole line of the output
    marker = MARK.search(text)
    assert marker is not None
    numbers = [int(line.split(":")[0]) for line in kept]
    missing = len(numbered) - len(kept)
    assert f"in {missing:,} line" in marker.group()
    assert f"of {len(output.encode()):,} bytes in {len(numbered):,} line" in marker.group()
    omitted_bytes = sum(len(numbered[n - 1]) + 1 for n in range(1, len(numbered) + 1)
                        if n not in set(numbers))
    assert f"[… {omitted_bytes:,} byte" in marker.group()


@settings(max_examples=150, deadline=None)
@given(body=lines, data=st.data(), budget=st.integers(1000, 40_000))
def test_a_capture_join_is_always_marked_within_the_budget(body: list[str], data: st.DataObject,
                                                            budget: int) -> None:
    output = "\n".join(body)
    at = data.draw(st.integers(0, len(output)))
    dropped = data.draw(st.integers(1, 10**7))
    gap = Gap(at, "stdout", dropped, data.draw(st.integers(0, dropped)), data.draw(st.booleans()))
    text = render(output, ModelHints(budget=budget, gaps=[gap], notes=data.draw(
        st.lists(st.text(max_size=12_000), max_size=3))))
    assert len(text) <= budget
    assert "[…" in text and "…]" in text
    marked, spans = mark_gaps(output, [gap])
    assert len(spans) == 1 and spans[0][2].bytes >= dropped
    # whatever is outside the marker is the output's own text, in order
    start, end, _ = spans[0]
    assert output.startswith(marked[:start]) and output.endswith(marked[end:])


def test_long_notes_after_a_short_text_still_fit() -> None:
    text = render("ok\n", ModelHints(budget=1000, notes=["n" * 5000]))
    assert len(text) <= 1000 and text.startswith("ok\n") and "of notes cut]" in text


def test_utf8_is_never_split_and_a_single_huge_line_is_marked_mid_line() -> None:
    output = "é" * 100_000  # one line of 200 000 bytes
    text = render(output, ModelHints(budget=5000))
    assert len(text) <= 5000
    text.encode("utf-8")  # whole characters only
    assert "a line was cut mid-line" in text
    assert "of 200,000 bytes in 1 line" in text


def _seq_capture(n: int, limit: int) -> tuple[str, list[CaptureGap]]:
    capture = OutputCapture(limit)
    data = "".join(f"{i}\n" for i in range(1, n + 1)).encode()
    for start in range(0, len(data), 65536):  # as the agent reads a pipe
        capture.add("stdout", data[start:start + 65536])
    snap = capture.snapshot()
    text = "".join(t for _, t in snap["chunks"])
    return text, [CaptureGap.model_validate(g) for g in snap["gaps"]]


def test_the_capture_join_is_marked_and_never_makes_a_fake_line() -> None:
    """seq 1 300000 through a 1 MiB capture used to read '...892\\n225103...' — as if 892 were
    followed by 225103. The join is now a line of its own naming what is missing."""
    text, gaps = _seq_capture(300_000, 1 << 20)
    assert len(gaps) == 1 and gaps[0].stream == "stdout" and gaps[0].bytes > 0
    marked, spans = mark_gaps(text, [Gap(g.at, g.stream, g.bytes, g.lines, g.line_start)
                                     for g in gaps])
    out = marked.split("\n")
    at = next(i for i, line in enumerate(out) if line.startswith("[…"))
    before, after = int(out[at - 1]), int(out[at + 1])
    missing = after - before - 1
    # every number on either side is whole and consecutive: nothing made up, nothing cut
    assert [int(x) for x in out[:at]] == list(range(1, before + 1))
    assert [int(x) for x in out[at + 1:-1]] == list(range(after, 300_001))
    missing_bytes = sum(len(f"{i}\n") for i in range(before + 1, after))
    assert out[at].startswith(f"[… {missing_bytes:,} bytes ({missing:,} line breaks) of stdout")
    assert spans[0][2].bytes == missing_bytes


def test_the_capture_counts_lines_and_reports_a_join_at_a_line_start() -> None:
    capture = OutputCapture(20)
    capture.add("stdout", b"aaaa\nbbbb\n")  # head: 10 bytes
    capture.add("stdout", b"cccc\n" * 4)  # 20 bytes: the first two lines dropped whole
    capture.add("stderr", b"oops\n")
    snap = capture.snapshot()
    assert snap["stdout_lines"] == 6 and snap["stderr_lines"] == 1
    assert snap["gaps"] == [[10, "stdout", 10, 2, True]]
    text = "".join(t for _, t in snap["chunks"])
    marked, _ = mark_gaps(text, [Gap(*g) for g in snap["gaps"]])
    assert marked == ("aaaa\nbbbb\n[… 10 bytes (2 line breaks) of stdout not kept here: the "
                      "capture keeps the head and tail of each stream …]\ncccc\ncccc\noops\n")


def test_output_and_metadata_stay_as_they_were() -> None:
    result = ToolResult(output="x" * 50_000, metadata={"a": 1})
    assert len(result.model_text()) <= 30_000
    assert result.output == "x" * 50_000 and result.to_json() == {
        "output": "x" * 50_000, "is_error": False, "metadata": {"a": 1}}
    assert len(result.model_text(budget=2000)) <= 2000
    result.model_hints.notes.append("(a note)")
    assert result.model_text().endswith("\n\n(a note)")
    assert ToolResult(output="short").model_text() == "short"
