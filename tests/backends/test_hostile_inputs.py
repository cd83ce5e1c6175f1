"""Input limits on every tool argument (issue 19): one check in ``Builtin`` before any work, a
tool error naming the argument and the setting (never could-not-run), the same through the
Python API, ``serve --stdio``, ``toolseam mcp`` and ``toolseam call``; on the host and docker."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client

from toolseam import Toolkit
from toolseam.policy.limits import MAX_ARG_STRLEN, InputLimits, not_text, oversized
from toolseam.policy.settings import Settings, parse_settings
from toolseam.seam.errors import FileOpError
from toolseam.seam.models import PathRef
from toolseam_agent.searcher import TIMEOUT

from ..support.engines import backend, remove_shared, shared_dir
from ..support.mcp import stdio_params
from ..support.stdio import RawServer

DEFAULTS = InputLimits()
# (tool, args with one argument over its default limit, the argument, the setting)
OVER = [
    ("bash", {"command": ":" + " " * MAX_ARG_STRLEN}, "command", "command_bytes"),
    ("bash", {"command": "true", "workdir": "d/" * 3000}, "workdir", "path_bytes"),
    ("bash", {"command": "true", "description": "d" * (16 << 20) + "d"}, "description",
     "content_bytes"),
    ("grep", {"pattern": "a" * 20_000_000}, "pattern", "pattern_chars"),
    ("grep", {"pattern": "a", "include": "*" * 20_000}, "include", "pattern_chars"),
    ("glob", {"pattern": "*" * 16_385}, "pattern", "pattern_chars"),
    ("read", {"filePath": "r/" * 2049}, "path", "path_bytes"),
    ("write", {"path": "w.txt", "content": "é" * (8 << 20) + "x"}, "content", "content_bytes"),
    ("edit", {"path": "w.txt", "oldString": "a", "new_string": "n" * ((16 << 20) + 1)},
     "newString", "content_bytes"),
    ("apply_patch", {"patchText": "p" * ((16 << 20) + 1)}, "patchText", "content_bytes"),
]


@pytest.fixture(params=["host", "docker"])
async def toolkit(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Toolkit]:
    if request.param == "host":
        async with Toolkit("host", base_dir=str(tmp_path)) as made:
            yield made
        return
    workspace = shared_dir()
    try:
        async with Toolkit(backend("docker", str(workspace))) as made:
            yield made
    finally:
        remove_shared(workspace)


async def test_every_argument_over_its_limit_is_a_tool_error(toolkit: Toolkit) -> None:
    for tool, args, name, setting in OVER:
        started = time.monotonic()
        result = await toolkit.call(tool, args)
        assert result.is_error, (tool, name)
        assert result.metadata == {"inputLimit": name}, (tool, result.metadata)
        assert result.output.startswith(f"{tool}: {name} is too long ("), result.output[:200]
        assert f"input_limits.{setting}" in result.output
        assert time.monotonic() - started < 2, (tool, name)  # refused before any work


async def test_a_lone_surrogate_is_a_tool_error_naming_the_argument(toolkit: Toolkit) -> None:
    """No encoding carries U+D800 to a process or a file system: a path holding one raised
    UnicodeEncodeError out of ``Toolkit.call``, a command holding one was could-not-run."""
    for tool, args, name in (("bash", {"command": "echo \ud800"}, "command"),
                             ("write", {"path": "w\ud800", "content": "x"}, "path"),
                             ("read", {"path": "\udfffr"}, "path"),
                             ("grep", {"pattern": "é\udbff"}, "pattern"),
                             ("write", {"path": "w", "content": "x\ud800"}, "content")):
        result = await toolkit.call(tool, args)
        assert result.is_error and result.metadata == {"invalidArgument": name}, result
        assert result.output.startswith(f"{tool}: {name} holds a lone surrogate (U+"), result
    # U+DC80..U+DCFF stand for undecodable bytes (names as a listing shows them): still usable
    assert not (await toolkit.call("write", {"path": "w\udcff", "content": "x"})).is_error
    assert (await toolkit.call("glob", {"pattern": "w*"})).output == "w\\xff"  # shown escaped


async def test_at_the_limit_runs(toolkit: Toolkit) -> None:
    """The command limit is the kernel's: one byte more could never start (it was reported as
    could-not-run, and ``toolseam call`` exited 3); at the limit the command runs."""
    command = "echo at-limit #" + "x" * (MAX_ARG_STRLEN - 15)
    assert len(command.encode()) == MAX_ARG_STRLEN
    result = await toolkit.call("bash", {"command": command})
    assert not result.is_error and result.output == "at-limit\n", result.output[:300]
    pattern = "a" * (DEFAULTS.pattern_chars - 1) + "$"
    assert not (await toolkit.call("grep", {"pattern": pattern})).is_error


async def test_limits_are_settings(tmp_path: Path) -> None:
    small = Settings(input_limits=InputLimits(command_bytes=10, pattern_chars=3, path_bytes=5,
                                              content_bytes=4))
    async with Toolkit("host", base_dir=str(tmp_path), settings=small) as toolkit:
        assert not (await toolkit.call("bash", {"command": "echo 12345"})).is_error
        too_long = await toolkit.call("bash", {"command": "echo 123456"})
        assert too_long.output.startswith("bash: command is too long (11 bytes; the limit is 10")
        # multi-byte text is measured in bytes (the kernel's unit), patterns in characters
        assert (await toolkit.call("write", {"path": "a", "content": "éé"})).output == \
            "Wrote 4 bytes to a"
        assert "content is too long (5 bytes" in (await toolkit.call(
            "write", {"path": "a", "content": "éé!"})).output
        assert not (await toolkit.call("glob", {"pattern": "ééé"})).is_error
        assert "input_limits.path_bytes" in (await toolkit.call("read", {"path": "abcdef"})).output


def test_limits_load_from_a_settings_file(tmp_path: Path) -> None:
    loaded = parse_settings({"input_limits": {"command_bytes": 1000, "json_depth": 64}})
    assert loaded.input_limits == InputLimits(command_bytes=1000, json_depth=64)
    for wrong, word in (({"command_bytes": MAX_ARG_STRLEN + 1}, "command_bytes"),
                        ({"pattern_chars": 0}, "pattern_chars"), ({"nope": 1}, "nope"),
                        ({"json_depth": 200_000}, "json_depth")):
        with pytest.raises(Exception, match=word):
            parse_settings({"input_limits": wrong})


@given(st.text(max_size=40), st.integers(1, 60))
@settings(max_examples=300, deadline=None)
def test_the_check_counts_utf8_bytes_and_pattern_characters(text: str, limit: int) -> None:
    limits = InputLimits(command_bytes=limit, pattern_chars=limit, path_bytes=limit,
                         content_bytes=limit)
    size = len(text.encode("utf-8", "surrogatepass"))
    for name in ("command", "path", "workdir", "content", "oldString"):
        assert (oversized(name, text, limits) is None) == (size <= limit), name
    for name in ("pattern", "include"):
        assert (oversized(name, text, limits) is None) == (len(text) <= limit), name


def test_cli_call_over_a_limit_is_a_tool_failure(tmp_path: Path) -> None:
    config = tmp_path / "settings.toml"
    config.write_text("[input_limits]\ncommand_bytes = 100\n")
    done = subprocess.run([sys.executable, "-m", "toolseam.frontends.cli", "call", "bash",
                           json.dumps({"command": "echo " + "x" * 200}), "--base-dir",
                           str(tmp_path), "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done  # a tool failure the model can fix, not 3 (could not run)
    assert "input_limits.command_bytes" in json.loads(done.stdout)["output"]


async def test_mcp_refuses_the_same_arguments(tmp_path: Path) -> None:
    async with Client(stdio_params(tmp_path)) as client:
        for tool, args in (("bash", {"command": ":" + " " * MAX_ARG_STRLEN}),
                           ("grep", {"pattern": "a" * 100_000})):
            result = await client.call_tool(tool, args)
            assert result.is_error
            assert isinstance(result.content[0], types.TextContent)
            assert "is too long" in result.content[0].text and "input_limits." in \
                result.content[0].text


def test_serve_stdio_refuses_the_same_arguments(tmp_path: Path) -> None:

    with RawServer("--base-dir", str(tmp_path)) as server:
        server.send({"id": 1, "tool": "bash", "args": {"command": ":" + " " * MAX_ARG_STRLEN}})
        answer: Any = server.answer()
        assert answer["result"]["is_error"] and answer["result"]["metadata"] == {
            "inputLimit": "command"}
        assert server.close() == 0


@pytest.mark.parametrize("engine", ["host", "docker"])
async def test_the_search_deadline_covers_compiling_the_pattern(engine: str, tmp_path: Path
                                                                ) -> None:
    """Below the builtin's limit (the backend called directly): a pattern that takes seconds to
    compile is stopped at the search deadline — the compile runs in the killable search
    process, never on a loop."""
    workspace = shared_dir() if engine == "docker" else tmp_path
    sandbox: Any = backend("docker", str(workspace)) if engine == "docker" else "host"
    try:
        async with Toolkit(sandbox, base_dir=str(tmp_path) if engine == "host" else None) as tk:
            started = time.monotonic()
            with pytest.raises(FileOpError) as caught:
                await tk.backend.grep(PathRef(base=tk.base_dir, path=".", confine=False),
                                      "a|" * 1_000_000 + "b", None, 300)
            assert caught.value.code == TIMEOUT
            assert time.monotonic() - started < 3
    finally:
        if engine == "docker":
            remove_shared(workspace)


SLOW_TO_COMPILE = "(?i)" + "[\u0100-\U0010ffff]a" * 1500  # 13 504 characters, 10-25 s to compile


@pytest.mark.parametrize("engine", ["host", "docker"])
async def test_an_invalid_pattern_is_reported_by_the_search_process(engine: str, tmp_path: Path
                                                                    ) -> None:
    workspace = shared_dir() if engine == "docker" else tmp_path
    sandbox: Any = backend("docker", str(workspace)) if engine == "docker" else "host"
    try:
        async with Toolkit(sandbox, base_dir=str(tmp_path) if engine == "host" else None) as tk:
            with pytest.raises(FileOpError) as caught:
                await tk.backend.grep(PathRef(base=tk.base_dir, path=".", confine=False),
                                      "a(b", None, 5000)
            assert (caught.value.code, caught.value.path) == ("bad_pattern", "a(b")
            assert "missing )" in caught.value.detail
            result = await tk.call("grep", {"pattern": "a(b"})
            assert result.output.startswith("grep: invalid pattern 'a(b': missing ), ")
    finally:
        if engine == "docker":
            remove_shared(workspace)


async def test_a_pattern_slow_to_compile_stops_at_the_search_timeout(tmp_path: Path) -> None:
    """The search timeout bounds the whole search, compiling the pattern included: the
    compile happens in the search process only, never on the host's event loop."""
    async with Toolkit("host", base_dir=str(tmp_path),
                       settings=Settings(search_timeout_ms=1000)) as toolkit:
        started = time.monotonic()
        result = await toolkit.call("grep", {"pattern": SLOW_TO_COMPILE})
        assert time.monotonic() - started < 4
        assert result.is_error and "took longer than 1000 ms" in result.output


@given(st.text(max_size=30))
@settings(max_examples=500, deadline=None)
def test_not_text_is_exactly_what_surrogateescape_cannot_encode(text: str) -> None:
    try:
        text.encode("utf-8", "surrogateescape")
        encodable = True
    except UnicodeEncodeError:
        encodable = False
    assert (not_text("x", text) is None) == encodable
