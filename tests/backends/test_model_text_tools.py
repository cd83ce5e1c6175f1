"""What each tool shows a model (``ToolResult.model_text``), on the host and in a container
(docker): cuts marked and paged from a spill file, how a command ended, capped listings, edit
and patch failures that say how to retry, text that is not UTF-8, images by content."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from toolseam import Settings, ToolResult

from ..support.engines import remove_shared
from ..support.model_sandboxes import WHERE, Sandbox, open_sandbox

MARK = re.compile(r"\[… [^\n]*?…\]")


@pytest_asyncio.fixture(params=WHERE)
async def box(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    tk, work = await open_sandbox(request.param)
    try:
        yield Sandbox(tk, work)
    finally:
        await tk.close()
        remove_shared(work)


def text_of(result: ToolResult) -> str:
    text = result.model_text()
    assert len(text) <= 30_000
    return text


# --- bash: the budget, the capture join, the spill file -------------------------------------
async def test_a_flood_is_cut_on_lines_marked_and_pageable_from_a_spill_file(box: Sandbox
                                                                             ) -> None:
    result = await box.call("bash", command="seq 1 300000")
    text = text_of(result)
    assert result.metadata["stdoutTruncated"] is True  # output/metadata as before
    markers = MARK.findall(text)
    assert len(markers) == 1
    marker = markers[0]
    assert "of 1,988,895 bytes in 300,000 lines" in marker
    shown = [int(x) for x in text.split("\n") if x and not MARK.fullmatch(x)]
    head = [n for n in shown if n < 100_000]
    tail = [n for n in shown if n >= 100_000]
    assert head == list(range(1, len(head) + 1)) and tail == list(range(tail[0], 300_001))
    missing = tail[0] - len(head) - 1
    assert f"in {missing:,} lines omitted" in marker
    spill = re.search(r"the whole output is in (\S+) \(lines ([\d,]+)-", marker)
    assert spill is not None
    path, first = spill.group(1), int(spill.group(2).replace(",", ""))
    if box.tk.info is not None and box.tk.info.local:  # the host's /tmp is shared: owner only
        assert os.stat(path).st_mode & 0o777 == 0o600
    # the confined session's read opens the spill file and pages it from the marker's line
    page = await box.call("read", path=path, offset=first, limit=3)
    assert not page.is_error, page.output
    assert page.output.split("\n")[:3] == [f"{first:05d}| {len(head) + 1}",
                                           f"{first + 1:05d}| {len(head) + 2}",
                                           f"{first + 2:05d}| {len(head) + 3}"]
    # the capture's own join is a marked line in the file: no fake "892\n225103"
    whole = await box.call("read", path=path, offset=89_000, limit=500)
    lines = [line.split("| ", 1)[1] for line in whole.output.split("\n") if "| " in line]
    join = next(i for i, line in enumerate(lines) if line.startswith("[…"))
    assert "of stdout not kept here" in lines[join]
    assert int(lines[join + 1]) - int(lines[join - 1]) > 100_000  # a gap said, not hidden


async def test_short_output_is_shown_whole_and_an_empty_one_says_so(box: Sandbox) -> None:
    result = await box.call("bash", command="printf 'a\\nb\\n'")
    assert result.model_text() == "a\nb\n"
    silent = await box.call("bash", command="true")
    assert (silent.output, silent.model_text()) == ("", "(no output)")


@pytest.mark.parametrize(("command", "expected"), [
    ("echo hi; exit 3", "hi\n\nbash: command exited with code 3"),
    ("kill -9 $$", "(the command was ended by signal 9 (SIGKILL))"),
    ("sh -c 'kill -15 $$'", "(exit code 143 usually means a process was ended by signal 15 "
                            "(SIGTERM))"),
])
async def test_bash_says_how_the_command_ended(box: Sandbox, command: str, expected: str
                                               ) -> None:
    result = await box.call("bash", command=command)
    assert result.is_error
    assert expected in text_of(result)


async def test_bash_says_a_timeout_killed_the_command_and_what_to_do(box: Sandbox) -> None:
    result = await box.call("bash", command="echo start; sleep 30", timeout=500)
    text = text_of(result)
    assert text.startswith("bash: command timed out after 500ms\nstart\n")
    assert "signal" not in text  # the timeout is what ended it: one sentence, not two
    assert ("(timed out after 500 ms: it and every process it started were killed; pass a "
            "larger timeout (in ms, at most 2147483647))") in text


async def test_bash_says_background_leftovers_were_killed(box: Sandbox) -> None:
    result = await box.call("bash", command="sleep 30 & echo started")
    assert "(1 process it left running in the background was killed when it ended" in \
        text_of(result)


# --- grep and glob ------------------------------------------------------------------------------
async def test_capped_listings_say_how_many_and_how_to_narrow(box: Sandbox) -> None:
    for n in range(150):
        box.put(f"src/f{n:03d}.py", b"needle\n")
    found = await box.call("grep", pattern="needle")
    assert found.output.count("\n") == 99  # output as before: 100 lines
    assert text_of(found).endswith(
        "\n\n(showing 100 of 150 matching lines, sorted by path then line; narrow with path, a "
        "tighter pattern or include (e.g. '*.py'), or raise limit)")
    listed = await box.call("glob", pattern="*.py", limit=10)
    assert text_of(listed).endswith("\n\n(showing 10 of 150 matching files, sorted; narrow with "
                                    "path or a more specific pattern, or raise limit)")


async def test_an_empty_listing_says_so_in_every_style(box: Sandbox) -> None:
    assert (await box.call("glob", pattern="*.none")).model_text() == "No files found"
    assert (await box.call("grep", pattern="nowhere-to-be-found")).model_text() == "No files found"
    tk, work = await open_sandbox("host", Settings(output_style="toolnexus"))
    try:
        quiet = await tk.call("glob", {"pattern": "*.none"})
        assert (quiet.output, quiet.model_text()) == ("", "No files found")
    finally:
        await tk.close()
        remove_shared(work)


async def test_glob_given_a_file_as_path_names_it(box: Sandbox) -> None:
    box.put("one.txt", b"x\n")
    result = await box.call("glob", pattern="*", path="one.txt")
    assert (result.is_error, result.model_text()) == (True, (
        "glob: path one.txt is a file, not a directory; give the directory to search (read "
        "opens a file)"))


# --- edit and apply_patch failures ------------------------------------------------------------
SOURCE = b"def main():\n    x = compute(1, 2)\n    print('done')\n    return x\n"


@pytest.mark.parametrize(("old", "expected"), [
    ("    x = compute(1,2)\n    print('done')",
     "First line of oldString that does not match: its line 1, '    x = compute(1,2)'. Closest "
     "candidate: file line 2: '    x = compute(1, 2)' — whitespace only (indentation or "
     "spacing)."),
    ("    y = compute(1, 2)\n    print('done')",
     "First line of oldString that does not match: its line 1, '    y = compute(1, 2)'. Closest "
     "candidate: file line 2: '    x = compute(1, 2)' — a changed word: 'y' where the file has "
     "'x'."),
    ("    x = compute(1, 2)\n    print(\"done\")",
     "First line of oldString that does not match: its line 2, '    print(\"done\")'. Closest "
     "candidate: file line 3: \"    print('done')\" — punctuation."),
])
async def test_edit_not_found_names_the_closest_line_and_the_difference(
        box: Sandbox, old: str, expected: str) -> None:
    box.put("f.py", SOURCE)
    result = await box.call("edit", path="f.py", oldString=old, newString="changed")
    assert result.output == "edit: oldString not found in f.py"  # as before
    assert text_of(result) == f"edit: oldString not found in f.py\n\n{expected}"


async def test_edit_already_applied_and_several_matches_are_said(box: Sandbox) -> None:
    box.put("f.py", SOURCE)
    again = await box.call("edit", path="f.py", oldString="compute(9, 9)",
                           newString="compute(1, 2)")
    assert "newString is already in the file (line 2) and oldString is not: the edit looks " \
           "already applied" in text_of(again)
    box.put("g.py", b"a = 1\nb = 2\na = 1\n\na = 1\n")
    several = await box.call("edit", path="g.py", oldString="a = 1", newString="a = 3")
    assert text_of(several).endswith("(it occurs at lines 1, 3, 5; add surrounding lines to "
                                     "oldString to pick one, or set replaceAll to change them "
                                     "all)")


def patch(*body: str) -> str:
    return "\n".join(["*** Begin Patch", *body, "*** End Patch"])


async def test_apply_patch_names_file_hunk_first_bad_line_and_candidate(box: Sandbox) -> None:
    box.put("f.py", SOURCE)
    result = await box.call("apply_patch", patchText=patch(
        "*** Update File: f.py", "@@", " def main():", "-    x = compute(1, 3)",
        "+    x = compute(3, 4)", "     print('done')"))
    text = text_of(result)
    assert text.startswith("apply_patch: f.py: hunk 1 does not match the file; expected:\n")
    assert ("First line of the hunk that does not match: its line 2, '    x = compute(1, 3)'. "
            "Closest candidate: file line 2: '    x = compute(1, 2)' — a changed word: "
            "'3)' where the file has '2)'.") in text
    assert text.endswith("Nothing was changed: fix that hunk and send the whole patch again.")


async def test_apply_patch_says_a_hunk_is_already_applied(box: Sandbox) -> None:
    box.put("f.py", SOURCE)
    change = patch("*** Update File: f.py", "@@", "-    x = compute(1, 2)",
                   "+    x = compute(3, 4)")
    assert not (await box.call("apply_patch", patchText=change)).is_error
    again = await box.call("apply_patch", patchText=change)
    assert again.is_error
    assert ("This hunk looks already applied: its new lines are in the file at line 2, its old "
            "lines are not.") in text_of(again)


async def test_pure_addition_chunk_followed_by_removal_applies_as_codex(box: Sandbox) -> None:
    """codex's test_pure_addition_chunk_followed_by_removal: every hunk is placed against the
    original lines, so the bare addition lands at the original end and the next hunk is still
    found above it."""
    path = box.put("panic.txt", b"line1\nline2\nline3\n")
    result = await box.call("apply_patch", patchText=patch(
        "*** Update File: panic.txt", "@@", "+after-context", "+second-line",
        "@@", " line1", "-line2", "-line3", "+line2-replacement"))
    assert not result.is_error, result.model_text()
    assert path.read_bytes() == b"line1\nline2-replacement\nafter-context\nsecond-line\n"


# --- read ----------------------------------------------------------------------------------
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(30))


async def test_read_knows_an_image_by_its_content(box: Sandbox) -> None:
    box.put("screenshot", PNG)  # no extension
    result = await box.call("read", path="screenshot")
    assert result.output == f"screenshot (image/png, {len(PNG)} bytes)"
    assert result.parts is not None and result.parts[0]["mimeType"] == "image/png"


async def test_read_knows_a_gif_without_nul_bytes_by_its_content(box: Sandbox) -> None:
    gif = b"GIF89a\x01\x01\x01\x01\xf7\xff" + bytes(range(1, 256))  # no NUL, not UTF-8
    box.put("anim", gif)
    result = await box.call("read", path="anim")
    assert result.output == f"anim (image/gif, {len(gif)} bytes)"


@pytest.mark.parametrize(("data", "kind"), [
    (b"\x7fELF\x02\x01\x01" + b"\x00" * 60, "an ELF executable"),
])
async def test_read_refuses_binary_naming_its_type(box: Sandbox, data: bytes, kind: str) -> None:
    box.put("blob", data)
    result = await box.call("read", path="blob")
    assert (result.is_error, result.model_text()) == (
        True, f"read: blob is a binary file ({kind}); it cannot be read as text")


async def test_read_decodes_utf16_with_a_byte_order_mark(box: Sandbox) -> None:
    box.put("wide.txt", "hello\nwörld\n".encode("utf-16"))
    result = await box.call("read", path="wide.txt")
    assert result.model_text() == ("00001| hello\n00002| wörld\n\n(end of file, 2 lines)\n"
                                   "(the file is not UTF-8: decoded as utf-16)")


async def test_a_long_read_page_is_held_to_the_budget_and_says_how_to_narrow(box: Sandbox
                                                                            ) -> None:
    box.put("wide.txt", ("y" * 99 + "\n").encode() * 2000)  # a 50 KiB page
    result = await box.call("read", path="wide.txt")
    text = text_of(result)
    assert "read wide.txt with offset and limit for a smaller window of lines" in text
    assert text.endswith("(Output capped at 50 KB. Showing lines 1-512. Use offset=513 to continue.)")


# --- the same text on every path -------------------------------------------------------------
async def test_model_text_is_the_same_for_every_call_form(box: Sandbox) -> None:
    args: dict[str, Any] = {"command": "seq 1 100000"}
    first = await box.call("bash", **args)
    second = await box.call("bash", **args)
    strip = re.compile(r"/tmp/\S+\.txt")  # each call has its own spill file
    assert strip.sub("F", first.model_text()) == strip.sub("F", second.model_text())


async def test_a_detached_job_says_its_id_and_its_flood_is_cut_too() -> None:
    tk, work = await open_sandbox("host", Settings(timeout_policy="detach",
                                                   default_timeout_ms=1500))
    try:
        result = await tk.call("bash", {"command": "seq 1 300000; sleep 30"})
        text = text_of(result)
        assert text.startswith("still running after 1500 ms (job 1) — output so far below; "
                               "bash {\"wait\": 1} keeps waiting, {\"kill\": 1} stops it")
        marker = MARK.search(text)
        assert marker is not None and "the whole output is in /tmp/toolseam-out-" in marker.group()
        stopped = await tk.call("bash", {"kill": 1})
        assert text_of(stopped).startswith("killed job 1\n")
        assert "signal" not in text_of(stopped)  # asked for: no "ended by signal" note
    finally:
        await tk.close()
        remove_shared(work)
