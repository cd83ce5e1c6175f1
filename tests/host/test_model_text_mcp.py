"""What a model reads through ``toolseam mcp`` (the text content of a tool result) and what
every declaration format tells it about bash: the same facts everywhere."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client

from toolseam import Settings, Toolkit
from toolseam.session.declarations import FORMATS

from ..support.mcp import stdio_params

MARK = re.compile(r"\[… [^\n]*?…\]")

# What a model must be told about bash, whatever the format (issue 22, point 7).
BASH_FACTS = ("fresh shell", "cd and export do not carry over", "workdir",
              "60000 ms", "at most 2147483647", "killed when it ends", "come back to with",
              "30000 characters", "512 KiB", "read tool can page")


def _bash_text(declared: dict[str, Any]) -> str:
    """A declaration's description and its parameters' descriptions, as one text."""
    return json.dumps(declared, ensure_ascii=False)


@pytest.mark.parametrize("fmt", FORMATS)
async def test_every_format_tells_the_same_bash_facts(fmt: str, tmp_path: Path) -> None:
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        declared = next(d for d in tk.declarations(fmt)  # type: ignore[arg-type]
                        if "bash" in (d.get("name"), d.get("function", {}).get("name")))
    text = _bash_text(declared)
    missing = [fact for fact in BASH_FACTS if fact not in text]
    assert not missing, (fmt, missing)


async def test_the_timeout_parameter_names_this_sessions_default_and_maximum(tmp_path: Path
                                                                             ) -> None:
    settings = Settings(timeout_policy="detach", timeout_range_ms=(1000, 900_000))
    async with Toolkit("host", base_dir=str(tmp_path), settings=settings) as tk:
        for fmt in FORMATS:
            text = _bash_text(next(d for d in tk.declarations(fmt)
                                   if "bash" in (d.get("name"), d.get("function", {}).get("name"))))
            assert "at least 1000, at most 900000" in text, fmt
            assert ("Left out: wait 600000 ms (10 min), then leave the command running as a "
                    "job (its id is in the reply).") in text, fmt


async def test_mcp_tools_and_text_content_are_what_a_model_is_shown(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    for n in range(150):
        (tmp_path / "src" / f"f{n:03d}.py").write_text("needle\n")
    async with Client(stdio_params(tmp_path)) as client:
        listed = await client.list_tools()
        bash = next(tool for tool in listed.tools if tool.name == "bash")
        text = json.dumps({"description": bash.description, "schema": bash.input_schema})
        assert not [fact for fact in BASH_FACTS if fact not in text]

        flood = await client.call_tool("bash", {"command": "seq 1 300000"})
        shown = flood.content[0]
        assert isinstance(shown, types.TextContent)
        assert len(shown.text) <= 30_000
        marker = MARK.search(shown.text)
        assert marker is not None and "of 1,988,895 bytes in 300,000 lines" in marker.group()
        spill = re.search(r"the whole output is in (\S+) \(lines ([\d,]+)-", marker.group())
        assert spill is not None
        page = await client.call_tool("read", {"path": spill.group(1),
                                               "offset": int(spill.group(2).replace(",", "")),
                                               "limit": 2})
        assert not page.is_error, page.content

        failed = await client.call_tool("bash", {"command": "kill -9 $$"})
        assert "(the command was ended by signal 9 (SIGKILL))" in failed.content[0].text  # type: ignore[union-attr]
        assert failed.structured_content is not None
        assert failed.structured_content["metadata"]["exitCode"] == -9  # metadata unchanged

        grep = await client.call_tool("grep", {"pattern": "needle"})
        assert "(showing 100 of 150 matching lines" in grep.content[0].text  # type: ignore[union-attr]


# --- the other paths to a model: serve --stdio, toolseam call, the spill file's life -----------
TOOLSEAM = [sys.executable, "-m", "toolseam.frontends.cli"]


def test_serve_stdio_sends_the_model_text_beside_output(tmp_path: Path) -> None:
    line = json.dumps({"id": 1, "tool": "bash", "args": {"command": "seq 1 300000; exit 2"}})
    done = subprocess.run([*TOOLSEAM, "serve", "--stdio", "--base-dir", str(tmp_path)],
                          input=line + "\n", capture_output=True, text=True, timeout=120)
    answer = json.loads(done.stdout.splitlines()[0])["result"]
    assert len(answer["output"]) > 1_000_000  # output as before
    text = answer["model_text"]
    assert len(text) <= 30_000 and MARK.search(text) is not None
    assert text.endswith("bash: command exited with code 2")


def test_call_prints_the_model_text_with_a_flag(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("needle\n" * 3)
    done = subprocess.run([*TOOLSEAM, "call", "grep", '{"pattern": "needle", "limit": 2}',
                           "--base-dir", str(tmp_path), "--model-text"],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout == ("a.txt:1:needle\na.txt:2:needle\n\n(showing 2 of 3 matching lines, "
                           "sorted by path then line; narrow with path, a tighter pattern or "
                           "include (e.g. '*.py'), or raise limit)\n")


async def test_the_hosts_spill_files_last_as_long_as_the_session(tmp_path: Path) -> None:
    async with Toolkit("host", base_dir=str(tmp_path), confine_to_base_dir=True) as tk:
        result = await tk.call("bash", {"command": "seq 1 100000"})
        spill = result.model_hints.spill
        assert spill is not None and Path(spill).is_file()
        page = await tk.call("read", {"path": spill, "offset": 2, "limit": 1})
        assert page.output.startswith("00002| 2\n")
        found = await tk.call("grep", {"pattern": "^99999$", "path": spill})
        assert found.output.endswith(":99999:99999"), found.output
        # only the session's own spill files pass confinement, not their neighbours
        (Path(spill).parent / "toolseam-out-not-mine.txt").write_text("x\n")
        try:
            other = await tk.call("read", {"path": str(Path(spill).parent /
                                                       "toolseam-out-not-mine.txt")})
            assert other.is_error and "resolves outside baseDir" in other.output
        finally:
            (Path(spill).parent / "toolseam-out-not-mine.txt").unlink()
    assert not Path(spill).exists()


# --- every point of the model text, through MCP and in-process alike --------------------------
def _setup(work: Path) -> None:
    (work / "src").mkdir()
    for n in range(150):
        (work / "src" / f"f{n:03d}.py").write_text("needle\n")
    (work / "f.py").write_text("def main():\n    x = compute(1, 2)\n    print('done')\n")
    (work / "g.py").write_text("a = 1\nb = 2\na = 1\n")
    (work / "latin.txt").write_bytes("café\n".encode("cp1252"))
    (work / "picture").write_bytes(b"BM" + b"\x00" * 60)
    (work / "shot").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(30)))
    (work / "panic.txt").write_text("line1\nline2\nline3\n")


_PATCH = "*** Begin Patch\n*** Update File: {}\n{}\n*** End Patch"
EVERY_POINT: list[tuple[str, dict[str, Any]]] = [
    ("bash", {"command": "seq 1 300000"}),
    ("bash", {"command": "kill -9 $$"}),
    ("bash", {"command": "echo start; sleep 30", "timeout": 300}),
    ("grep", {"pattern": "needle"}),
    ("glob", {"pattern": "*.none"}),
    ("glob", {"pattern": "*", "path": "f.py"}),
    ("edit", {"path": "f.py", "oldString": "    y = compute(1, 2)", "newString": "z"}),
    ("edit", {"path": "g.py", "oldString": "a = 1", "newString": "a = 3"}),
    ("apply_patch", {"patchText": _PATCH.format("f.py", "@@\n-    x = compute(1,3)\n+    x = 0")}),
    ("read", {"path": "latin.txt"}),
    ("read", {"path": "picture"}),
    ("read", {"path": "shot"}),
    ("apply_patch", {"patchText": _PATCH.format(
        "panic.txt", "@@\n+after-context\n+second-line\n@@\n line1\n-line2\n-line3\n"
                     "+line2-replacement")}),
    ("apply_patch", {"patchText": _PATCH.format(
        "panic.txt", "@@\n line1\n-line2\n-line3\n+line2-replacement")}),
]


def _same(text: str, work: Path) -> str:
    text = text.replace(str(work), "WORK")
    return re.sub(r"/tmp/toolseam-out-\S+?\.txt", "SPILL", text)


async def test_every_point_reads_the_same_through_mcp_as_in_python(tmp_path: Path) -> None:
    over_mcp, in_python = tmp_path / "mcp", tmp_path / "python"
    for work in (over_mcp, in_python):
        work.mkdir()
        _setup(work)
    expected = []
    async with Toolkit("host", base_dir=str(in_python), confine_to_base_dir=True) as tk:
        for name, args in EVERY_POINT:
            expected.append(_same((await tk.call(name, args)).model_text(), in_python))
    async with Client(stdio_params(over_mcp)) as client:
        for (name, args), want in zip(EVERY_POINT, expected, strict=True):
            got = await client.call_tool(name, args)
            first = got.content[0]
            assert isinstance(first, types.TextContent)
            assert _same(first.text, over_mcp) == want, (name, args)
    assert (over_mcp / "panic.txt").read_text() == (
        "line1\nline2-replacement\nafter-context\nsecond-line\n")
    assert "This hunk looks already applied" in expected[-1]
