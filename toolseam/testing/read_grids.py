"""The file part's two read grids (``FileContract``): every line window and every page of a few
contents that differ in their line ends, each checked against an oracle.

Each case reads a file already in the sandbox and changes nothing, so a grid runs whole in ONE
sandbox. As one test per case it opened a sandbox per case: 84 per backend, 1 344 of the
suite's 5 067 tests and most of the contract run's container starts (issue 45).
"""

from __future__ import annotations

from toolseam import FileOpError
from toolseam.seam import BuiltinExec, PageRequest, PathRef

WINDOW_CONTENTS = ("", "a", "a\n", "a\nb", "a\r\nb\r\n", "x\ry\n\n")
WINDOWS: tuple[tuple[int | None, int | None], ...] = (
    (None, None), (1, 1), (2, 1), (2, 5), (3, 1), (5, 2), (None, 0), (1, None))
PAGE_CONTENTS = ("", "a", "a\n", "a\nb", "a\r\nb\r\n", "x\n\n\ny")
PAGES = ((1, 2000), (1, 1), (2, 1), (2, 5), (3, 2), (1, 0))  # (offset, limit)


def _oracle_window(text: str, offset: int | None, limit: int | None) -> str:
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = (offset or 1) - 1
    return "\n".join(lines[start : None if limit is None else start + limit])


async def read_window_mismatch(backend: BuiltinExec, ref: PathRef, content: str,
                               window: tuple[int | None, int | None]) -> str | None:
    """What is wrong with ``read_text`` of ``window`` of the file ``ref`` (which holds
    ``content``): a line saying so, or None when the text and size are right."""
    got = await backend.read_text(ref, *window)
    expected = (_oracle_window(content, *window) if window != (None, None)
                else content.replace("\r\n", "\n").replace("\r", "\n"))
    size = len(content.encode())
    if (got.text, got.size) == (expected, size):
        return None
    return (f"{content!r}, window {window}: got {got.text!r} ({got.size} bytes), "
            f"expected {expected!r} ({size} bytes)")


async def read_page_mismatch(backend: BuiltinExec, ref: PathRef, content: str, offset: int,
                             limit: int) -> str | None:
    """What is wrong with ``read_page`` at ``offset``/``limit`` of the file ``ref`` (which
    holds ``content``): a page of exactly those lines, or ``past_end`` naming the line count."""
    lines = content.replace("\r\n", "\n").split("\n")
    if lines[-1] == "":
        lines.pop()
    expected: tuple[object, ...]
    if offset > len(lines) and not (offset == 1 and not lines):
        expected = ("past_end", str(len(lines)))
    else:
        more = offset - 1 + limit < len(lines)
        expected = (lines[offset - 1 : offset - 1 + limit], offset + limit if more else None,
                    None if more else len(lines), len(content.encode()))
    try:
        page = await backend.read_page(ref, PageRequest(offset=offset, limit=limit))
    except FileOpError as exc:
        got: tuple[object, ...] = (exc.code, exc.detail)
    else:
        got = (page.lines, page.next, page.total, page.size)
    if got == expected:
        return None
    return f"{content!r}, offset {offset} limit {limit}: got {got!r}, expected {expected!r}"
