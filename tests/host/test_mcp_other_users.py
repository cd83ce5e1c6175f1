"""Another local user against ``toolseam mcp --http`` run by root (issue 44, item 1): loopback
is no boundary on a shared machine. Without the token the server generated (which they cannot
read) they get 401 for every request; over ``unix:PATH`` the socket's mode 0600 keeps them
from connecting at all; the owner is served both ways. The other user is an account the test
makes (``tests/support/local_user.py``); everything stays on this machine."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from ..support.local_user import run_as_other_user
from ..support.mcp import GENERATED, TOOLSEAM, connect, start_http, stop, text

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the server runs as root here")

# A whole MCP exchange by hand (the system python3 has no SDK): initialize, then a bash call.
OTHER_CLIENT = r'''
import json, sys, urllib.error, urllib.request
url, path = sys.argv[1], sys.argv[2]
headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
def post(body, extra={}):
    request = urllib.request.Request(url, json.dumps(body).encode(), {**headers, **extra})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()
status, head, _ = post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {},
    "clientInfo": {"name": "other", "version": "1"}}})
session = {"mcp-session-id": head.get("mcp-session-id", "")}
call = post({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
    "name": "bash", "arguments": {"command": "id -u; cat " + path}}}, session)
try:
    open(sys.argv[3]).read()
    token = "read"
except OSError as exc:
    token = type(exc).__name__
print(json.dumps({"initialize": status, "call": call[0], "answer": call[2], "token": token}))
'''


async def test_another_user_gets_nothing_from_a_loopback_server(tmp_path: Path) -> None:
    secret = tmp_path / "root-only" / "secret.txt"
    secret.parent.mkdir(mode=0o700)
    secret.write_text("the root-only secret\n")
    env = {k: v for k, v in os.environ.items() if k != "TOOLSEAM_MCP_TOKEN"}
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log", env=env,
                              confine=False)
    try:
        said = (tmp_path.parent / f"{tmp_path.name}.log").read_text()
        token_file = said.split("generated into ")[1].split(",")[0] if url in GENERATED else "-"
        done = run_as_other_user(OTHER_CLIENT, url, str(secret), token_file)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert (seen["initialize"], seen["call"]) == (401, 401), seen
        assert "root-only secret" not in seen["answer"] and seen["token"] == "PermissionError"
        async with connect(url) as owner:  # the owner, with the token it can read: served
            result = await owner.call_tool("bash", {"command": f"id -u; cat {secret}"})
        assert not result.is_error and text(result) == "0\nthe root-only secret\n", text(result)
    finally:
        stop(process)


OTHER_CONNECT = r'''
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    print("connected")
except OSError as exc:
    print(type(exc).__name__)
'''


async def test_a_unix_socket_is_the_owners_alone(tmp_path: Path) -> None:
    where = tmp_path / "mcp.sock"
    tmp_path.chmod(0o755)  # others may pass through: only the socket's own mode stops them
    log = tmp_path.parent / f"{tmp_path.name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([*TOOLSEAM, "mcp", "--http", f"unix:{where}", "--base-dir",
                                    str(tmp_path)], stdout=subprocess.DEVNULL, stderr=out)
    try:
        deadline = time.monotonic() + 30
        while "listening" not in log.read_text() and process.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log.read_text() == (f"toolseam mcp: listening on unix socket {where}, path /mcp "
                                   "(mode 0600: this user only)\n")
        assert stat.S_IMODE(where.stat().st_mode) == 0o600 and where.stat().st_uid == 0
        done = run_as_other_user(OTHER_CONNECT, str(where))
        assert done.stdout.strip() == "PermissionError", (done.stdout, done.stderr)
        http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(where)))
        async with http, Client(streamable_http_client("http://localhost/mcp",
                                                       http_client=http)) as owner:
            result = await owner.call_tool("bash", {"command": "id -u"})
        assert not result.is_error and text(result) == "0\n", text(result)
    finally:
        stop(process)
    assert not where.exists()  # removed at the end
