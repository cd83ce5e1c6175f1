"""read, edit, write, grep and glob as models trained on opencode and codex expect them, on the
host backend and in a container (docker), byte for byte."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from toolseam import Settings

from ..support.engines import remove_shared
from ..support.model_sandboxes import WHERE, Sandbox, open_sandbox


@pytest_asyncio.fixture(params=WHERE)
async def box(request: pytest.FixtureRequest) -> AsyncIterator[Sandbox]:
    tk, work = await open_sandbox(request.param)
    try:
        yield Sandbox(tk, work)
    finally:
        await tk.close()
        remove_shared(work)


# --- read ---------------------------------------------------------------------------------
async def test_read_pages_2000_lines_and_names_the_next_offset(box: Sandbox) -> None:
    box.put("long.txt", "".join(f"line {n}\n" for n in range(1, 2501)).encode())
    first = await box.call("read", path="long.txt")
    lines = first.output.split("\n")
    assert lines[0] == "00001| line 1" and lines[1999] == "02000| line 2000"
    assert lines[-1] == "(showing lines 1-2000; the file has more: read on with offset=2001)"
    assert first.metadata["next"] == 2001 and first.metadata["truncated"] is True
    rest = await box.call("read", path="long.txt", offset=2001)
    assert rest.output.split("\n")[0] == "02001| line 2001"
    assert rest.output.endswith("02500| line 2500\n\n(end of file, 2500 lines)")
    assert rest.metadata["total"] == 2500


async def test_read_page_is_capped_in_bytes(box: Sandbox) -> None:
    box.put("wide.txt", ("x" * 999 + "\n").encode() * 200)  # 200 KB in 200 lines
    page = await box.call("read", path="wide.txt")
    assert page.metadata["lines"] == 51  # about 50 KiB: the line that crosses it is left out
    assert page.output.endswith("(Output capped at 50 KB. Showing lines 1-51. Use offset=52 to continue.)")


async def test_read_cuts_long_lines_with_a_note(box: Sandbox) -> None:
    box.put("one-line.txt", b"short\n" + b"y" * 3_000_000 + b"\nend\n")
    result = await box.call("read", path="one-line.txt")
    assert result.output == ("00001| short\n00002| " + "y" * 2000 + "\n00003| end\n\n"
                             "(line 2 cut at 2000 characters)\n(end of file, 3 lines)")
    assert result.metadata["cutLines"] == [2]


async def test_read_a_huge_line_without_newline_is_bounded(box: Sandbox) -> None:
    with open(box.work / "huge.txt", "wb") as f:
        f.write(b"z" * (64 << 20))  # 64 MiB, no newline
    os.chmod(box.work / "huge.txt", 0o666)
    result = await box.call("read", path="huge.txt", offset=1, limit=5)
    assert result.output == "00001| " + "z" * 2000 + (
        "\n\n(line 1 cut at 2000 characters)\n(end of file, 1 line)")


@pytest.mark.parametrize(("name", "data", "expected"), [
    ("nul.txt", b"text\x00more", "read: nul.txt is a binary file (it holds NUL bytes); "
                                 "it cannot be read as text"),
    ("lib.so", b"plain", "read: lib.so is a binary file (.so); it cannot be read as text"),
])
async def test_read_refuses_binary_content(box: Sandbox, name: str, data: bytes,
                                           expected: str) -> None:
    box.put(name, data)
    result = await box.call("read", path=name)
    assert (result.is_error, result.output) == (True, expected)


async def test_read_decodes_text_that_is_not_utf8(box: Sandbox) -> None:
    box.put("latin.txt", "café\nnaïve\n".encode("cp1252"))
    result = await box.call("read", path="latin.txt")
    assert (result.is_error, result.output) == (False, (
        "00001| café\n00002| naïve\n\n(end of file, 2 lines)\n"
        "(the file is not UTF-8: decoded as cp1252)"))
    box.put("bad.txt", b"\x81\x8d\x8f\x90\x9d\n")  # undefined in cp1252: latin-1
    result = await box.call("read", path="bad.txt")
    assert result.output.endswith("(the file is not UTF-8: decoded as latin-1)")


async def test_read_offset_past_the_end_is_an_error(box: Sandbox) -> None:
    box.put("three.txt", b"a\nb\nc\n")
    result = await box.call("read", path="three.txt", offset=9)
    assert (result.is_error, result.output) == (True, "read: offset 9 is past the end of "
                                                      "three.txt (3 lines)")
    box.put("empty.txt", b"")
    assert (await box.call("read", path="empty.txt")).output == "(empty file)"


async def test_read_image_is_an_attachment(box: Sandbox) -> None:
    gif = b"GIF89a" + bytes(range(30))
    box.put("pic.gif", gif)
    result = await box.call("read", path="pic.gif")
    assert result.parts is not None and result.parts[0]["mimeType"] == "image/gif"
    assert base64.b64decode(result.parts[0]["data"]) == gif


async def test_read_directory_lists_sorted_entries(box: Sandbox) -> None:
    for rel in ("d/b.txt", "d/A.txt", "d/sub/x.txt", "d/a.txt"):
        box.put(rel, b"x")
    result = await box.call("read", path="d")
    assert result.output == "d is a directory:\nA.txt\na.txt\nb.txt\nsub/"
    assert result.metadata == {"directory": True, "entries": 4, "truncated": False}


async def test_read_hides_the_bom(box: Sandbox) -> None:
    box.put("bom.txt", b"\xef\xbb\xbfhello\n")
    assert (await box.call("read", path="bom.txt")).output.startswith("00001| hello\n")


# --- edit ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("before", "after"), [
    (b"a\nb\nc\n", b"a\nB\nB2\nc\n"),
    (b"a\r\nb\r\nc\r\n", b"a\r\nB\r\nB2\r\nc\r\n"),
    (b"a\r\nb\nc\n", b"a\r\nB\nB2\nc\n"),  # mixed: each break keeps the style it replaces
])
async def test_edit_matches_any_line_ending(box: Sandbox, before: bytes, after: bytes) -> None:
    box.put("f.txt", before)
    result = await box.call("edit", path="f.txt", oldString="a\nb\n", newString="a\nB\nB2\n")
    assert not result.is_error, result.output
    assert (box.work / "f.txt").read_bytes() == after


async def test_edit_empty_old_string_creates_a_file(box: Sandbox) -> None:
    created = await box.call("edit", path="new/dir/f.txt", oldString="", newString="hi\n")
    assert created.output == "Created new/dir/f.txt (3 bytes)"
    assert (box.work / "new/dir/f.txt").read_bytes() == b"hi\n"
    box.put("empty.txt", b"")
    assert not (await box.call("edit", path="empty.txt", oldString="", newString="x")).is_error
    assert (box.work / "empty.txt").read_bytes() == b"x"


async def test_edit_empty_old_string_replaces_an_existing_file_keeping_its_bom(
        box: Sandbox) -> None:
    """opencode's ``preserves BOM when oldString is empty on existing files``: the whole
    content is replaced, the byte-order mark stays (and is not doubled)."""
    box.put("existing.cs", "\ufeffusing System;\n".encode())
    result = await box.call("edit", path="existing.cs", oldString="", newString="using Up;\n")
    assert not result.is_error, result.output
    assert (box.work / "existing.cs").read_bytes() == "\ufeffusing Up;\n".encode()
    await box.call("edit", path="existing.cs", oldString="", newString="\ufeffusing Again;\n")
    assert (box.work / "existing.cs").read_bytes() == "\ufeffusing Again;\n".encode()
    box.put("plain.txt", b"old\n")
    replaced = await box.call("edit", path="plain.txt", oldString="", newString="new\n")
    assert replaced.output == ("Replaced the whole content of plain.txt (4 bytes): an empty "
                               "oldString stands for the whole file")
    assert (box.work / "plain.txt").read_bytes() == b"new\n"


async def test_edit_keeps_the_bom(box: Sandbox) -> None:
    box.put("bom.txt", b"\xef\xbb\xbfalpha\r\n")
    result = await box.call("edit", path="bom.txt", oldString="alpha", newString="beta")
    assert not result.is_error, result.output
    assert (box.work / "bom.txt").read_bytes() == b"\xef\xbb\xbfbeta\r\n"


async def test_edit_accepts_the_argument_names_models_send(box: Sandbox) -> None:
    box.put("f.txt", b"one one\n")
    result = await box.tk.call("edit", {"file_path": "f.txt", "old_string": "one",
                                        "new_string": "two", "replace_all": True})
    assert result.output == "Edited f.txt (2 replacements)"
    both = await box.tk.call("edit", {"path": "f.txt", "file_path": "f.txt", "oldString": "two",
                                      "newString": "x"})
    assert both.output == ("edit: invalid input: file_path and path name the same field; "
                           "send one of them")
    declared = box.tk.declarations("openai")[3]["function"]["parameters"]["properties"]
    assert set(declared) == {"path", "oldString", "newString", "replaceAll"}


# --- write --------------------------------------------------------------------------------
async def test_write_keeps_the_bom(box: Sandbox) -> None:
    box.put("bom.txt", b"\xef\xbb\xbfold\n")
    await box.call("write", path="bom.txt", content="new\n")
    assert (box.work / "bom.txt").read_bytes() == b"\xef\xbb\xbfnew\n"
    await box.call("write", path="plain.txt", content="new\n")
    assert (box.work / "plain.txt").read_bytes() == b"new\n"


@pytest.mark.parametrize(("tool", "args"), [
    ("write", {"path": "ro.txt", "content": "x"}),
    ("edit", {"path": "ro.txt", "oldString": "keep", "newString": "x"}),
    ("apply_patch", {"patchText": "*** Begin Patch\n*** Update File: ro.txt\n@@\n-keep\n+x\n"
                                  "*** End Patch"}),
])
async def test_read_only_files_are_refused(box: Sandbox, tool: str, args: dict[str, Any]) -> None:
    box.put("ro.txt", b"keep\n", mode=0o444)
    result = await box.tk.call(tool, args)
    assert result.is_error and result.output == f"{tool}: permission denied: ro.txt"
    assert (box.work / "ro.txt").read_bytes() == b"keep\n"
    assert (box.work / "ro.txt").stat().st_mode & 0o777 == 0o444


@pytest.mark.parametrize("where", WHERE)
async def test_write_requires_read_when_set(where: str) -> None:
    tk, work = await open_sandbox(where, Settings(write_requires_read=True))
    try:
        (work / "seen.txt").write_text("a\n")
        (work / "seen.txt").chmod(0o666)
        refused = await tk.call("write", {"path": "seen.txt", "content": "b\n"})
        assert refused.output == ("write: seen.txt already exists and was not read in this "
                                  "session; read it first, then write")
        assert (work / "seen.txt").read_text() == "a\n"
        assert not (await tk.call("write", {"path": "fresh.txt", "content": "new"})).is_error
        await tk.call("read", {"path": "seen.txt"})
        assert not (await tk.call("write", {"path": "seen.txt", "content": "b\n"})).is_error
        assert (work / "seen.txt").read_text() == "b\n"
    finally:
        await tk.close()
        remove_shared(work)


# --- grep, glob ---------------------------------------------------------------------------
async def test_empty_results_say_so(box: Sandbox) -> None:
    box.put("a.txt", b"alpha\n")
    for tool, args in (("grep", {"pattern": "omega"}), ("glob", {"pattern": "*.none"})):
        result = await box.tk.call(tool, args)
        assert (result.output, result.is_error, result.metadata["count"]) == (
            "No files found", False, 0)
