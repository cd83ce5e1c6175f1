"""Byte-exact outputs of the seven builtins (CONTRACT §3), input validation, declarations."""

from __future__ import annotations

import ast
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import toolseam.builtins
from toolseam import ConfigurationError, CouldNotRunError, Toolkit, ToolResult, UnknownToolError
from toolseam.testing.fake import FakeBackend


@pytest_asyncio.fixture
async def tk(tmp_path: Path) -> AsyncIterator[Toolkit]:
    async with Toolkit("host", base_dir=str(tmp_path), confine_to_base_dir=True) as toolkit:
        yield toolkit


async def call(tk: Toolkit, tool: str, **args: Any) -> ToolResult:
    return await tk.call(tool, args)


async def test_bash_exit_zero_is_output_as_is(tk: Toolkit) -> None:
    result = await call(tk, "bash", command="printf 'a\\n'; printf 'b' >&2")
    assert (result.output, result.is_error) == ("a\nb", False)
    assert result.metadata["exitCode"] == 0
    assert result.metadata["shell"] == "/bin/sh -c"
    assert (result.metadata["stdoutBytes"], result.metadata["stderrBytes"]) == (2, 1)


async def test_bash_nonzero_exit_appends_the_code(tk: Toolkit) -> None:
    result = await call(tk, "bash", command="echo out; exit 3")
    assert result.output == "out\n\nbash: command exited with code 3"
    assert result.is_error and result.metadata["exitCode"] == 3


async def test_bash_signal_death_reports_minus_signum(tk: Toolkit) -> None:
    result = await call(tk, "bash", command="kill -9 $$")
    assert result.output == "\nbash: command exited with code -9"


async def test_bash_timeout_shape(tk: Toolkit) -> None:
    result = await call(tk, "bash", command="echo before; sleep 30", timeout=300)
    assert result.output == "bash: command timed out after 300ms\nbefore\n"
    assert result.metadata["timedOut"] is True and result.metadata["killedTree"] is True
    assert "exitCode" not in result.metadata


async def test_bash_workdir_resolves_against_base(tk: Toolkit, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    result = await call(tk, "bash", command="pwd", workdir="sub")
    assert result.output == f"{tmp_path}/sub\n"
    outside = await call(tk, "bash", command="pwd", workdir="..")
    assert outside.output == f"bash: .. resolves outside baseDir {tmp_path}"
    missing = await call(tk, "bash", command="pwd", workdir="nope")
    assert missing.output == "bash: nope does not exist"


async def test_bash_default_workdir_is_base(tk: Toolkit, tmp_path: Path) -> None:
    assert (await call(tk, "bash", command="pwd")).output == f"{tmp_path}\n"


async def test_read_whole_and_window(tk: Toolkit, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"one\r\ntwo\nthree\n")
    assert (await call(tk, "read", path="f.txt")).output == (
        "00001| one\n00002| two\n00003| three\n\n(end of file, 3 lines)")
    window = await call(tk, "read", path="f.txt", offset=2, limit=1)
    assert window.output == "00002| two\n\n(showing lines 2-2; the file has more: read on with offset=3)"
    assert window.metadata == {"bytes": 15, "offset": 2, "lines": 1, "next": 3, "total": None,
                               "truncated": True, "cutLines": []}
    past = await call(tk, "read", path="f.txt", offset=4)
    assert past.is_error and past.output == "read: offset 4 is past the end of f.txt (3 lines)"


async def test_read_toolnexus_style_keeps_raw_text(tmp_path: Path) -> None:
    from toolseam import Settings

    (tmp_path / "f.txt").write_bytes(b"one\r\ntwo\nthree\n")
    async with Toolkit("host", base_dir=str(tmp_path),
                       settings=Settings(output_style="toolnexus")) as tk:
        assert (await call(tk, "read", path="f.txt")).output == "one\ntwo\nthree\n"
        assert (await call(tk, "read", path="f.txt", offset=2, limit=2)).output == "two\nthree"
        assert (await call(tk, "read", path="f.txt", offset=4)).output == ""
        assert (await call(tk, "glob", pattern="*.none")).output == ""
        assert (await call(tk, "grep", pattern="nothing here")).output == ""


async def test_read_media_returns_a_content_part(tk: Toolkit, tmp_path: Path) -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
    (tmp_path / "pic.PNG").write_bytes(png)
    result = await call(tk, "read", path="pic.PNG")
    assert result.output == f"pic.PNG (image/png, {len(png)} bytes)"
    assert result.parts is not None
    assert result.parts[0]["type"] == "image" and base64.b64decode(result.parts[0]["data"]) == png


@pytest.mark.parametrize(("setup", "args", "expected"), [
    ({}, {"path": "nope.txt"}, "read: nope.txt does not exist"),
    ({}, {"path": "f.txt", "offset": 0}, "read: invalid input: offset: Value error, must be >= 1, got 0"),
    ({}, {"path": "f.txt", "offset": 1.5},
     "read: invalid input: offset: Value error, must be a whole number, got 1.5"),
    ({}, {"path": 3}, "read: invalid input: path must be a string"),
    ({}, {"path": "f", "extra": 1}, "read: invalid input: unknown field 'extra'"),
    ({}, {}, "read: invalid input: path is required"),
])
async def test_read_errors_are_clear(tk: Toolkit, tmp_path: Path, setup: dict[str, bytes],
                                     args: dict[str, Any], expected: str) -> None:
    for name, data in setup.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    result = await tk.call("read", args)
    assert result.is_error
    assert result.output == expected.replace("Value error, ", "")


async def test_read_above_the_cap_asks_for_a_window(tmp_path: Path) -> None:
    from toolseam import Settings

    (tmp_path / "big.txt").write_text("x\n" * 100)
    async with Toolkit("host", base_dir=str(tmp_path),
                       settings=Settings(read_max_bytes=50, output_style="toolnexus")) as tk:
        whole = await call(tk, "read", path="big.txt")
        window = await call(tk, "read", path="big.txt", offset=1, limit=2)
    assert whole.output == ("read: big.txt is 200 bytes, over the 50-byte limit for a whole-file "
                            "read; pass offset and limit to read a window of lines")
    assert window.output == "x\nx"


async def test_toolnexus_window_is_bounded_too(tmp_path: Path) -> None:
    """A window never holds more than the cap, however long the file's lines."""
    from toolseam import Settings

    (tmp_path / "long.txt").write_text("a\n" + "y" * 300_000 + "\nz\n")
    async with Toolkit("host", base_dir=str(tmp_path),
                       settings=Settings(read_max_bytes=1000, output_style="toolnexus")) as tk:
        first = await call(tk, "read", path="long.txt", offset=1, limit=1)
        past = await call(tk, "read", path="long.txt", offset=3, limit=1)  # skips the long line
        huge = await call(tk, "read", path="long.txt", offset=2, limit=1)
    assert first.output == "a"
    assert past.output == "read: that window of long.txt holds more than the 1000-character limit; " \
        "ask for fewer lines"
    assert huge.output == past.output


async def test_write_counts_utf8_bytes_and_keeps_mode(tk: Toolkit, tmp_path: Path) -> None:
    result = await call(tk, "write", path="deep/er/f.txt", content="héllo")
    assert result.output == "Wrote 6 bytes to deep/er/f.txt" and result.metadata["bytes"] == 6
    (tmp_path / "x.sh").write_text("old")
    (tmp_path / "x.sh").chmod(0o700)
    await call(tk, "write", path="x.sh", content="new")
    assert (tmp_path / "x.sh").stat().st_mode & 0o777 == 0o700


async def test_edit_outputs(tk: Toolkit, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_bytes(b"a b a\r\nline two\r\n")
    one = await call(tk, "edit", path="f.txt", oldString="b", newString="B")
    assert one.output == "Edited f.txt (1 replacement)"
    dup = await call(tk, "edit", path="f.txt", oldString="a", newString="A")
    assert dup.output == "edit: oldString is not unique in f.txt (2 occurrences); use replaceAll"
    assert (tmp_path / "f.txt").read_bytes() == b"a B a\r\nline two\r\n"
    many = await call(tk, "edit", path="f.txt", oldString="a", newString="A", replaceAll=True)
    assert many.output == "Edited f.txt (2 replacements)"
    missing = await call(tk, "edit", path="f.txt", oldString="zzz", newString="y")
    assert missing.output == "edit: oldString not found in f.txt"
    # a multi-line edit written with \n still matches a CRLF file, and the file stays CRLF
    crlf = await call(tk, "edit", path="f.txt", oldString="A\nline", newString="A\nLINE")
    assert crlf.output == "Edited f.txt (1 replacement)"
    assert (tmp_path / "f.txt").read_bytes() == b"A B A\r\nLINE two\r\n"


async def test_grep_and_glob_shapes(tk: Toolkit, tmp_path: Path) -> None:
    for rel, text in {"b.txt": "x1\nno\nx2\n", "a/c.py": "x3\n", "a/d.txt": "x4\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    (tmp_path / "bin.txt").write_bytes(b"x\xff")
    grep = await call(tk, "grep", pattern="x\\d", limit=3)
    assert grep.output == "a/c.py:1:x3\na/d.txt:1:x4\nb.txt:1:x1"
    assert grep.metadata == {"count": 3, "total": 4, "truncated": True, "skippedBinary": 1,
                             "skippedUnreadable": 0}
    only_txt = await call(tk, "grep", pattern="x", include="*.txt", path="a")
    assert only_txt.output == "d.txt:1:x4"
    glob = await call(tk, "glob", pattern="**/*.txt")
    assert glob.output == "a/d.txt\nb.txt\nbin.txt"
    assert glob.metadata["total"] == 3
    missing = await call(tk, "glob", pattern="*", path="nope")
    assert missing.output == "glob: nope does not exist"
    bad = await call(tk, "grep", pattern="(")
    assert bad.is_error and bad.output.startswith("grep: invalid pattern '(':")


async def test_unknown_tool_is_a_host_error(tk: Toolkit) -> None:
    with pytest.raises(UnknownToolError):
        await tk.call("webfetch", {})


async def test_confinement_without_base_dir_is_a_host_error() -> None:
    with pytest.raises(ConfigurationError, match="confine_to_base_dir needs a base_dir"):
        Toolkit("host", confine_to_base_dir=True)


async def test_disabled_tool_and_host_tool_shadowing(tmp_path: Path) -> None:
    class Shadow:
        name = "read"
        description = "host read"
        input_schema: dict[str, Any] = {"type": "object", "properties": {}}

        async def execute(self, args: dict[str, Any]) -> ToolResult:
            return ToolResult(output="from the host")

    async with Toolkit("host", base_dir=str(tmp_path), tools={"bash": False},
                       host_tools=[Shadow()]) as tk:
        assert "bash" not in tk.tool_names
        assert (await tk.call("read", {"path": "x"})).output == "from the host"
        with pytest.raises(UnknownToolError):
            await tk.call("bash", {"command": "true"})
        anthropic = {d["name"]: d for d in tk.declarations("anthropic")}
        assert anthropic["read"]["description"] == "host read"
    with pytest.raises(ConfigurationError, match="unknown builtin"):
        Toolkit("host", tools={"bsh": False})


async def test_could_not_run_reaches_the_model_or_the_host() -> None:
    backend = FakeBackend()
    async with Toolkit(backend) as tk:
        backend.fail_with = CouldNotRunError("engine unreachable at unix:///nope", retryable=True)
        result = await tk.call("read", {"path": "x"})
        assert result.is_error and result.metadata == {
            "failure": "could_not_run", "reason": "engine unreachable at unix:///nope",
            "retryable": True, "cause": "other"}
        assert result.output == "read: could not run: engine unreachable at unix:///nope"
        backend.fail_with = None
    backend = FakeBackend()
    async with Toolkit(backend, raise_could_not_run=True) as tk:
        backend.fail_with = CouldNotRunError("gone", retryable=False)
        with pytest.raises(CouldNotRunError):
            await tk.call("bash", {"command": "true"})
        backend.fail_with = None


def test_declarations_follow_the_toolnexus_names_and_types() -> None:
    tk = Toolkit(FakeBackend())
    openai = {d["function"]["name"]: d["function"]["parameters"] for d in tk.declarations("openai")}
    expected = {
        "bash": ({"command": "string", "workdir": "string", "timeout": "integer",
                  "description": "string"}, ["command"]),
        "read": ({"path": "string", "offset": "integer", "limit": "integer"}, ["path"]),
        "write": ({"path": "string", "content": "string"}, ["path", "content"]),
        "edit": ({"path": "string", "oldString": "string", "newString": "string",
                  "replaceAll": "boolean"}, ["path", "oldString", "newString"]),
        "apply_patch": ({"patchText": "string"}, ["patchText"]),
        "grep": ({"pattern": "string", "path": "string", "include": "string", "limit": "integer"},
                 ["pattern"]),
        "glob": ({"pattern": "string", "path": "string", "limit": "integer"}, ["pattern"]),
    }
    assert list(openai) == list(expected)
    for name, (props, required) in expected.items():
        schema = openai[name]
        assert {k: v["type"] for k, v in schema["properties"].items()} == props
        assert schema["required"] == required and schema["additionalProperties"] is False
    gemini = tk.declarations("gemini")[0]
    assert gemini["parameters"]["type"] == "OBJECT" and "additionalProperties" not in gemini["parameters"]
    assert json.dumps(tk.declarations("anthropic"))  # serialisable as is


def test_builtins_never_touch_the_host_directly() -> None:
    """No second code path: the builtins import neither os nor subprocess, and never call open."""
    package = Path(toolseam.builtins.__file__).parent
    for source in package.glob("*.py"):
        tree = ast.parse(source.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"os", "subprocess", "shutil", "pathlib", "io"} & set(names), source
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "open", source


async def test_fake_backend_runs_every_tool_without_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a seam configured, a tool call cannot reach os.open or a subprocess."""
    import os
    import subprocess

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a builtin touched the host")

    async with Toolkit(FakeBackend(files={"a.txt": b"hello\n"})) as tk:
        monkeypatch.setattr(os, "open", refuse)
        monkeypatch.setattr(subprocess, "Popen", refuse)
        results = [await tk.call(n, a) for n, a in [
            ("read", {"path": "a.txt"}), ("write", {"path": "b.txt", "content": "x"}),
            ("edit", {"path": "a.txt", "oldString": "hello", "newString": "bye"}),
            ("apply_patch", {"patchText": "*** Begin Patch\n*** Add File: c.txt\n+c\n*** End Patch"}),
            ("grep", {"pattern": "bye"}), ("glob", {"pattern": "*"}), ("bash", {"command": "echo hi"})]]
    assert [r.is_error for r in results] == [False] * 7
    assert results[4].output == "a.txt:1:bye" and results[5].output == "a.txt\nb.txt\nc.txt"


@pytest.mark.parametrize("path", ["CON", "nul.txt", "sub/Com1.log", "a/LPT9"])
async def test_portable_names_refuse_windows_devices(tmp_path: Path, path: str) -> None:
    from toolseam import Settings

    async with Toolkit("host", base_dir=str(tmp_path), settings=Settings(portable_names=True)) as tk:
        result = await tk.call("write", {"path": path, "content": "x"})
        patch = f"*** Begin Patch\n*** Add File: {path}\n+x\n*** End Patch"
        patched = await tk.call("apply_patch", {"patchText": patch})
    stem = path.rsplit("/", 1)[-1].split(".")[0].upper()
    assert result.output == f"write: invalid path {path!r}: {stem} is a reserved Windows device name"
    assert patched.is_error and "reserved Windows device name" in patched.output
    assert list(tmp_path.iterdir()) == []
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:  # off by default: plain names
        assert not (await tk.call("write", {"path": "console.txt", "content": "x"})).is_error
