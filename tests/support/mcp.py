"""Running ``toolseam mcp``: over stdio for the official client, over HTTP as a process; a tree
outside the base dir for read-scope questions; bearer tokens and a client per principal."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from .cli import TOOLSEAM
from .timing import patience


def stdio_params(work: Path, *extra: str, confine: bool = True) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable,
                                 args=["-m", "toolseam.frontends.cli", "mcp", "--base-dir", str(work),
                                       *(["--confine"] if confine else []), *extra],
                                 env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


GENERATED: dict[str, str] = {}  # a server's URL -> the token it generated (no token given)
_GENERATED_AT = re.compile(r"generated into (\S+), readable")


def start_http(work: Path, log: Path, *extra: str, env: dict[str, str] | None = None,
               confine: bool = True) -> tuple[str, subprocess.Popen[bytes]]:
    """``toolseam mcp --http`` on 127.0.0.1, waited for until it accepts connections and has
    said where it listens; the token it generated (none given) goes in ``GENERATED``."""
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen([*TOOLSEAM, "mcp", "--http", f"127.0.0.1:{port}", "--base-dir",
                                    str(work), *(["--confine"] if confine else []), *extra],
                                   stdout=subprocess.DEVNULL, stderr=out, env=env)
    deadline = time.monotonic() + patience(90)  # the import alone took 26 s under load
    while time.monotonic() < deadline:
        said = log.read_text()
        if "listening on" in said:
            url = f"http://127.0.0.1:{port}/mcp"
            found = _GENERATED_AT.search(said)
            if found:
                GENERATED[url] = Path(found[1]).read_text().strip()
            return url, process
        if process.poll() is not None:
            break
        time.sleep(0.1)
    stop(process)
    pytest.fail(f"toolseam mcp --http did not start: {log.read_text()}")


@contextlib.asynccontextmanager
async def connect(url: str, **options: Any) -> AsyncIterator[Client]:
    """The official client of a server started without a token, with the one it generated."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {GENERATED[url]}"})
    async with http, Client(streamable_http_client(url, http_client=http), **options) as made:
        yield made


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


TOKENS = {"alice": secrets.token_hex(32), "mallory": secrets.token_hex(32)}


def tokens_file(tmp: Path) -> list[str]:
    """The server's ``--auth-token-file``: one line per client, each its own principal."""
    path = tmp.parent / f"{tmp.name}-tokens"
    path.write_text("".join(f"{token}\n" for token in TOKENS.values()))
    path.chmod(0o600)
    return ["--auth-token-file", str(path)]


@contextlib.asynccontextmanager
async def client(url: str, who: str, **options: Any) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKENS[who]}"})
    async with http, Client(streamable_http_client(url, http_client=http), **options) as made:
        yield made


def text(result: types.CallToolResult) -> str:
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    return first.text

