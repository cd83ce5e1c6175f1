"""What the MCP server declares and says: the logging capability it uses (``logging/setLevel``
honoured), and plain words about the host backend to the model."""

from __future__ import annotations

from pathlib import Path

import mcp_types as types
import pytest
from mcp import Client

from ..support.mcp import connect, start_http, stdio_params, stop


@pytest.mark.filterwarnings("ignore:The logging capability is deprecated")  # what 2025 clients use
async def test_logging_is_declared_and_set_level_is_honoured(tmp_path: Path) -> None:
    logs: list[tuple[str | None, object]] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append((params.logger, params.data))

    async with Client(stdio_params(tmp_path), mode="legacy", logging_callback=on_log) as client:
        assert client.server_capabilities.logging is not None
        await client.set_logging_level("warning")  # above the info level output is sent at
        quiet = await client.call_tool("bash", {"command": "echo quiet"})
        assert quiet.content[0].text == "quiet\n" and logs == []  # type: ignore[union-attr]
        await client.set_logging_level("info")
        await client.call_tool("bash", {"command": "echo loud"})
    assert logs == [("stdout", "loud\n")]


@pytest.mark.parametrize("confine", [True, False])
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_host_backend_is_described_as_what_it_is(tmp_path: Path, confine: bool,
                                                           mode: str) -> None:
    async with Client(stdio_params(tmp_path, confine=confine), mode=mode) as client:
        said = client.instructions or ""
        listed = await client.list_tools()
    assert "sandboxed" not in said
    assert "commands run directly on this machine as the user running the server" in said
    assert "there is no container" in said
    assert ("Only the file tools are confined to the base directory; bash is not." in said) is confine
    bash = next(tool for tool in listed.tools if tool.name == "bash")
    assert "runs directly on the host machine as the server's user" in (bash.description or "")


@pytest.mark.parametrize("shared", [False, True])
async def test_http_clients_are_told_whose_session_it_is(tmp_path: Path, shared: bool) -> None:
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log",
                              *(["--shared-sandbox"] if shared else []))
    try:
        async with connect(url) as client:
            said = client.instructions or ""
    finally:
        stop(process)
    assert "sandboxed" not in said and "directly on this machine" in said
    if shared:
        assert "one session (jobs, read approvals) shared by every client of this server" in said
    else:
        assert "a session of your own per client session" in said
        assert "your default session" in said and '"sandbox": "new"' in said
