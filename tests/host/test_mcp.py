"""``toolseam mcp`` driven by the official MCP client, over stdio and streamable HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import psutil
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from ..support.mcp import connect, start_http, stdio_params, stop
from ..support.timing import patience

ALL_CALLS: dict[str, dict[str, Any]] = {
    "write": {"path": "new.txt", "content": "one\ntwo\n"},
    "read": {"path": "new.txt"},
    "edit": {"path": "new.txt", "oldString": "two", "newString": "TWO"},
    "apply_patch": {"patchText": "*** Begin Patch\n*** Add File: p.txt\n+patched\n*** End Patch"},
    "grep": {"pattern": "TWO"},
    "glob": {"pattern": "*.txt"},
    "bash": {"command": "cat new.txt p.txt"},
}


async def exercise(client: Client, work: Path) -> None:
    listed = await client.list_tools()
    by_name = {tool.name: tool for tool in listed.tools}
    assert sorted(by_name) == sorted(ALL_CALLS)
    for name, tool in by_name.items():
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is (name in ("read", "grep", "glob"))
        assert tool.annotations.destructive_hint is (name not in ("read", "grep", "glob"))
        assert tool.input_schema["type"] == "object"
    outputs = {}
    for name, args in ALL_CALLS.items():
        result = await client.call_tool(name, args)
        assert not result.is_error, (name, result.content)
        assert isinstance(result.content[0], types.TextContent)
        outputs[name] = result.content[0].text
    assert outputs["read"].startswith("00001| one\n00002| two\n")
    assert outputs["grep"] == "new.txt:2:TWO"
    assert outputs["glob"] == "new.txt\np.txt"
    assert outputs["bash"] == "one\nTWO\npatched\n"
    assert (work / "new.txt").read_text() == "one\nTWO\n"
    failed = await client.call_tool("bash", {"command": "exit 4"})
    assert failed.is_error and failed.structured_content is not None
    assert failed.structured_content["metadata"]["exitCode"] == 4
    refused = await client.call_tool("read", {"path": "../outside"})
    assert refused.is_error and "resolves outside baseDir" in refused.content[0].text  # type: ignore[union-attr]
    unknown = await client.call_tool("webfetch", {"url": "x"})
    assert unknown.is_error and "unknown tool" in unknown.content[0].text  # type: ignore[union-attr]


async def test_stdio_lists_and_calls_all_seven(tmp_path: Path) -> None:
    async with Client(stdio_params(tmp_path)) as client:
        await exercise(client, tmp_path)


async def test_stdio_streams_output_as_progress_and_log(tmp_path: Path) -> None:
    logs: list[types.LoggingMessageNotificationParams] = []
    progress: list[tuple[float, str | None]] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, message))

    async with Client(stdio_params(tmp_path), logging_callback=on_log, log_level="info") as client:
        result = await client.call_tool("bash", {"command": "echo out; sleep 0.2; echo err >&2"},
                                        progress_callback=on_progress)
    assert result.content[0].text == "out\nerr\n"  # type: ignore[union-attr]
    assert [(log.logger, log.data) for log in logs] == [("stdout", "out\n"), ("stderr", "err\n")]
    assert progress == [(4.0, "out\n"), (8.0, "err\n")]


async def test_could_not_run_is_an_error_result_naming_the_reason(tmp_path: Path) -> None:
    params = stdio_params(tmp_path, "--backend", "docker", "--workspace", str(tmp_path))
    params.args[params.args.index("--base-dir") + 1] = "/workspace"
    params.env = {**(params.env or {}), "TOOLSEAM_DOCKER_URL": "unix:///nonexistent/docker.sock"}
    async with Client(params) as client:
        result = await client.call_tool("read", {"path": "x"})
    assert result.is_error
    meta = result.structured_content["metadata"]  # type: ignore[index]
    assert meta["failure"] == "could_not_run" and meta["retryable"] is True
    assert "/nonexistent/docker.sock" in result.content[0].text  # type: ignore[union-attr]


def _approval_params(work: Path, tmp: Path) -> StdioServerParameters:
    config = tmp / "settings.json"
    config.write_text(json.dumps({"read_scope": "working-dir"}))
    return stdio_params(work / "inside", "--config", str(config), "--approvals", confine=False)


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # 2026-07-28 input requests; 2025 elicitation
async def test_read_scope_asks_through_elicitation(outside_tree: Path, tmp_path: Path,
                                                   mode: str) -> None:
    asked: list[str] = []

    async def elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"answer": "once"})

    async with Client(_approval_params(outside_tree, tmp_path), elicitation_callback=elicit,
                      mode=mode) as client:
        result = await client.call_tool("read", {"path": str(outside_tree / "outside.txt")})
    assert not result.is_error, result.content
    assert asked == [f"read wants to read {outside_tree / 'outside.txt'}, outside "
                     f"{outside_tree / 'inside'}."]


async def test_read_scope_without_elicitation_refuses(outside_tree: Path, tmp_path: Path) -> None:
    async with Client(_approval_params(outside_tree, tmp_path)) as client:
        result = await client.call_tool("read", {"path": str(outside_tree / "outside.txt")})
    assert result.is_error and "was not approved" in result.content[0].text  # type: ignore[union-attr]


# --- streamable HTTP ----------------------------------------------------------------------


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes], Path]]:
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}-server.log")
    try:
        yield url, process, tmp_path
    finally:
        stop(process)


def agents_of(process: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The server's live agents. One that ends while it is looked at (a zombie, or gone) is not
    one: under load a closing sandbox's agent was caught as a zombie (issue 45)."""
    found = []
    for child in psutil.Process(process.pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # ZombieProcess is one
            if ("--toolseam-agent" in " ".join(child.cmdline()) and child.name() != "unshare"
                    and child.status() != psutil.STATUS_ZOMBIE):
                found.append(child)
    return found


async def test_http_lists_and_calls_all_seven(http_server: tuple[str, Any, Path]) -> None:
    url, _, work = http_server
    async with connect(url) as client:
        await exercise(client, work)


async def test_http_one_sandbox_per_session_closed_at_its_end(
        http_server: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    """2025-11-25 clients have sessions over HTTP: one sandbox each, closed with the session."""
    url, process, _ = http_server
    async with connect(url, mode="legacy") as first, connect(url, mode="legacy") as second:
        await first.call_tool("bash", {"command": "true"})
        await second.call_tool("bash", {"command": "true"})
        assert len(agents_of(process)) == 2
    deadline = time.monotonic() + patience(30)
    while agents_of(process) and time.monotonic() < deadline:  # each deleted session's closes
        await asyncio.sleep(0.1)
    assert agents_of(process) == []


async def test_http_sessionless_clients_share_their_principals_default_sandbox(
        http_server: tuple[str, subprocess.Popen[bytes], Path]) -> None:
    """2026-07-28 requests stand alone: on a loopback server without a token every handle-less
    call goes to the one default sandbox (one agent); "new" opens another, named by the handle
    its results carry; the server's stop closes them all."""
    url, process, _ = http_server
    async with connect(url) as first, connect(url) as second:
        one = await first.call_tool("bash", {"command": "true"})
        two = await second.call_tool("bash", {"command": "true"})
        assert len(agents_of(process)) == 1
        assert "sandbox" not in (one.structured_content or {})
        opened = await second.call_tool("bash", {"command": "true", "sandbox": "new"})
        assert len(agents_of(process)) == 2
        mine = opened.structured_content["sandbox"]
        said = opened.content[-1].text  # type: ignore[union-attr]
        assert mine in said and "default sandbox" in said, said
        again = await first.call_tool("bash", {"command": "true", "sandbox": mine})
        assert not again.is_error and not two.is_error and len(agents_of(process)) == 2
    agents = agents_of(process)
    process.terminate()
    process.wait(timeout=15)
    for agent in agents:
        agent.wait(timeout=15)  # raises if a sandbox outlived the server


async def test_http_shared_sandbox_is_one_for_everyone(tmp_path: Path) -> None:
    """--shared-sandbox, on purpose: every client uses the server's one sandbox."""
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}-server.log",
                              "--shared-sandbox")
    try:
        async with connect(url) as first, connect(url, mode="legacy") as second:
            listed = await first.list_tools()
            assert all("sandbox" not in tool.input_schema["properties"] for tool in listed.tools)
            await first.call_tool("bash", {"command": "true"})
            await second.call_tool("bash", {"command": "true"})
            assert len(agents_of(process)) == 1
        assert len(agents_of(process)) == 1
        agent = agents_of(process)[0]
    finally:
        stop(process)
    agent.wait(timeout=15)  # raises if the sandbox outlived the server
