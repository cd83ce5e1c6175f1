"""The text a model is shown for one tool result: ``ToolResult.model_text()``.

``output`` and ``metadata`` stay byte-stable (transcripts, goldens, token estimates); this layer
builds what a model reads from them and from hints the builtin left on the result:

* where the sandbox's capture dropped the middle of a stream (head + tail), the join is put on
  line boundaries and marked with what is missing;
* the whole text is held to a budget (``Settings.model_output_chars``): past it, a head and a
  tail are kept, cut on line boundaries, and the marker between them names the bytes and lines
  left out, of how many, and where to page them (a file ``read`` opens, or offset/limit);
* notes the builtin adds (an exit status, a capped listing, why an edit did not match) follow
  the text, so a cut never hides them.

Text is Python ``str``: a cut never splits a character, so its UTF-8 is never split either.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_BUDGET = 30_000
NOTES_SHARE = 4  # notes take at most 1/NOTES_SHARE of the budget; the text gets the rest
_MIN_SIDE = 40  # below this many characters a side is not worth keeping


@dataclass(frozen=True)
class Gap:
    """Captured text dropped at character offset ``at`` of the output (the capture's head/tail
    join): ``bytes`` bytes holding ``lines`` line breaks of ``stream`` were never kept;
    ``line_start``: the kept text after the join begins a line."""

    at: int
    stream: str
    bytes: int
    lines: int
    line_start: bool = False


@dataclass
class ModelHints:
    """What a builtin tells the renderer beyond ``output``."""

    budget: int = DEFAULT_BUDGET
    notes: list[str] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    spill: str | None = None  # a file holding the whole (captured) output, for ``read``
    more: str | None = None  # how to see the rest when there is no spill file ("read … offset")
    total_bytes: int | None = None  # of the command's real output, where it was more than kept
    total_lines: int | None = None


def _fmt(n: int) -> str:
    return f"{n:,}"


def _plural(n: int, word: str) -> str:
    return f"{_fmt(n)} {word}{'' if n == 1 else 's'}"


def _count_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def mark_gaps(output: str, gaps: list[Gap]) -> tuple[str, list[tuple[int, int, Gap]]]:
    """``output`` with each capture gap on a line of its own, naming what is missing.

    The partial lines on either side of the join are dropped (and counted as missing) when the
    side holds a line break: the join never makes one line out of two halves (``seq 1 300000``
    used to show ``892`` followed by ``225103`` as if it were one line). Returns the text and
    ``(start, end, gap)`` spans of the markers in it, the gap counting what it now stands for."""
    if not gaps:
        return output, []
    pieces: list[str] = []
    spans: list[tuple[int, int, Gap]] = []
    length = 0
    last = 0
    ordered = sorted(gaps, key=lambda g: g.at)
    for index, gap in enumerate(ordered):
        before = output[last:gap.at]
        missing, lines = gap.bytes, gap.lines
        if before and not before.endswith("\n") and (cut := before.rfind("\n")) >= 0:
            missing += len(before[cut + 1:].encode())  # the head's partial last line
            before = before[:cut + 1]
        skip = 0
        if not gap.line_start:
            following = ordered[index + 1].at if index + 1 < len(ordered) else len(output)
            nl = output.find("\n", gap.at, following)
            if nl >= 0:  # the tail's partial first line
                skip = nl + 1 - gap.at
                missing += len(output[gap.at:nl + 1].encode())
                lines += 1
        pieces.append(before)
        length += len(before)
        lead = "\n" if before and not before.endswith("\n") else ""  # a head of one partial line
        marker = (f"{lead}[… {_plural(missing, 'byte')} ({_plural(lines, 'line break')}) of "
                  f"{gap.stream} not kept here: the capture keeps the head and tail of each "
                  "stream …]\n")
        pieces.append(marker)
        spans.append((length, length + len(marker),
                      Gap(gap.at, gap.stream, missing, lines, gap.line_start)))
        length += len(marker)
        last = gap.at + skip
    pieces.append(output[last:])
    return "".join(pieces), spans


def _clip_notes(notes: list[str], room: int) -> str:
    text = "\n".join(notes)
    if len(text) <= room:
        return text
    marker = f"\n[… {_plural(len(text) - room, 'character')} of notes cut]"
    keep = max(0, room - len(marker) - 12)
    return (text[:keep] + marker)[:room]


def render(output: str, hints: ModelHints | None = None) -> str:
    """The model's text for ``output``; see the module docstring."""
    hints = hints or ModelHints()
    budget = max(hints.budget, 200)
    body, spans = mark_gaps(output, hints.gaps)
    notes = "\n".join(hints.notes)
    if len(_join(body, notes)) <= budget:
        return _join(body, notes)
    # Notes get what the text leaves, and at least a quarter of the budget when both are long.
    note_room = max(budget // NOTES_SHARE, budget - len(body) - 2)
    if len(notes) > note_room:
        notes = _clip_notes(hints.notes, note_room)
    room = budget - len(notes) - (2 if notes else 0)
    if len(body) <= room:
        return _join(body, notes)
    return _join(_cut(body, spans, room, hints), notes)


def _join(body: str, notes: str) -> str:
    """Notes after the text, one blank line between."""
    if not body or not notes:
        return body + notes
    return body + ("\n" if body.endswith("\n") else "\n\n") + notes


def _cut(body: str, spans: list[tuple[int, int, Gap]], room: int, hints: ModelHints) -> str:
    """A head and a tail of ``body`` on line boundaries with a marker between, in ``room``."""
    total_lines = hints.total_lines
    total_bytes = hints.total_bytes
    body_lines = _count_lines(body)
    reserve = 400 + len(hints.spill or "") + len(hints.more or "")
    for _ in range(8):  # the marker's length depends on the numbers in it: shrink until it fits
        side = max(0, room - reserve) // 2
        head_end = _line_start_before(body, side)
        tail_start = _line_start_after(body, len(body) - side)
        if tail_start < head_end:
            tail_start = head_end
        marker = _marker(body, head_end, tail_start, spans, body_lines, total_bytes,
                         total_lines, hints)
        text = body[:head_end] + marker + body[tail_start:]
        if len(text) <= room:
            return text
        reserve += len(text) - room + 16
    # Pathological budgets: the marker alone, cut to fit (still says a cut happened).
    short = f"[… output cut: {_plural(len(body.encode()), 'byte')} not shown …]"
    return short[:room]


def _line_start_before(body: str, limit: int) -> int:
    """The end of the last whole line within ``body[:limit]`` (a cut mid-line only when the
    first line alone is longer than ``limit``)."""
    if limit <= 0:
        return 0
    if limit >= len(body):
        return len(body)
    nl = body.rfind("\n", 0, limit)
    if nl >= 0:
        return nl + 1
    return limit if limit >= _MIN_SIDE else 0


def _line_start_after(body: str, start: int) -> int:
    """The start of the first whole line at or after ``start``."""
    if start <= 0:
        return 0
    if start >= len(body):
        return len(body)
    if body[start - 1] == "\n":
        return start
    nl = body.find("\n", start)
    if nl >= 0:
        return nl + 1
    return start if len(body) - start >= _MIN_SIDE else len(body)


def last_line_of(body: str, end: int) -> int:
    """The number of the line holding ``body[end - 1]`` (0 for an empty prefix)."""
    if end <= 0:
        return 0
    return body.count("\n", 0, end) + (0 if body[end - 1] == "\n" else 1)


def _marker(body: str, head_end: int, tail_start: int, spans: list[tuple[int, int, Gap]],
            body_lines: int, total_bytes: int | None, total_lines: int | None,
            hints: ModelHints) -> str:
    omitted = body[head_end:tail_start]
    omitted_bytes = len(omitted.encode())
    omitted_lines = max(0, last_line_of(body, tail_start) - body.count("\n", 0, head_end))
    for start, end, gap in spans:  # capture gaps inside the cut count as what they stood for
        if head_end <= start and end <= tail_start:
            omitted_bytes += gap.bytes - len(body[start:end].encode())
            omitted_lines += gap.lines - 1
    first_line = body.count("\n", 0, head_end) + 1
    last_line = max(first_line, last_line_of(body, tail_start))
    of_bytes = total_bytes if total_bytes is not None else len(body.encode())
    of_lines = total_lines if total_lines is not None else body_lines
    mid_line = (head_end and body[head_end - 1] != "\n") or (
        tail_start < len(body) and tail_start and body[tail_start - 1] != "\n")
    where = ""
    if hints.spill:
        where = (f"; the whole output is in {hints.spill} (lines {_fmt(first_line)}-"
                 f"{_fmt(last_line)} there): read it with offset={first_line} and a limit")
    elif hints.more:
        where = f"; {hints.more}"
    lead = "\n" if head_end and body[head_end - 1] != "\n" else ""
    trail = "\n" if tail_start < len(body) else ""
    cut_word = " (a line was cut mid-line)" if mid_line else ""
    return (f"{lead}[… {_plural(omitted_bytes, 'byte')} in {_plural(omitted_lines, 'line')} "
            f"omitted here, of {_plural(of_bytes, 'byte')} in {_plural(of_lines, 'line')}"
            f"{cut_word}{where} …]{trail}")
