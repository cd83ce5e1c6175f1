"""``toolseam mcp --http`` is not an open door, and says where it is: a bearer token on every
request once configured, refused at start on a non-loopback address without one, the address
printed, a missing base dir caught before serving. Real server processes on 127.0.0.1 only; the
non-loopback cases are refused before anything listens, so no traffic leaves the machine."""

from __future__ import annotations

import os
import re
import secrets
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from ..support.mcp import TOOLSEAM, free_port, start_http, stop
from ..support.timing import patience

INIT = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def token_file(tmp_path: Path, token: str, mode: int = 0o600) -> Path:
    path = tmp_path.parent / f"{tmp_path.name}-token"
    path.write_text(token + "\n")
    path.chmod(mode)
    return path


def assert_refused(url: str, headers: dict[str, str]) -> None:
    for method in ("POST", "GET", "DELETE"):
        response = httpx.request(method, url, headers={**HEADERS, **headers}, json=INIT
                                 if method == "POST" else None, timeout=10)
        assert response.status_code == 401, (method, headers, response.text)
        assert response.headers["www-authenticate"].startswith("Bearer "), response.headers


async def assert_serves(url: str, token: str) -> None:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        result = await client.call_tool("bash", {"command": "echo hi; env"})
    assert not result.is_error and result.content[0].text.startswith("hi\n")  # type: ignore[union-attr]
    assert token not in result.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize("source", ["file", "environment"])
async def test_a_configured_token_is_required_on_every_request(tmp_path: Path, source: str) -> None:
    token = secrets.token_hex(32)
    if source == "file":
        extra, env = ["--auth-token-file", str(token_file(tmp_path, token))], None
    else:
        extra, env = [], {**os.environ, "TOOLSEAM_MCP_TOKEN": token}
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log", *extra, env=env)
    try:
        assert_refused(url, {})
        assert_refused(url, {"Authorization": f"Bearer {secrets.token_hex(32)}"})
        assert_refused(url, {"Authorization": f"Bearer {token[:-1]}"})
        assert_refused(url, {"Authorization": f"Basic {token}"})
        await assert_serves(url, token)
        # a legacy (2025-11-25) session too: its every request carries the token
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http, Client(streamable_http_client(url, http_client=http),
                                mode="legacy") as client:
            assert not (await client.call_tool("bash", {"command": "true"})).is_error
    finally:
        stop(process)


def run_mcp(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([*TOOLSEAM, "mcp", *args], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=patience(90), env=env)
    except subprocess.TimeoutExpired:  # a refusal is an exit; only a server that started waits
        pytest.fail(f"toolseam mcp {' '.join(args)} started instead of refusing")


def assert_one_line_exit_2(done: subprocess.CompletedProcess[str], *words: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("toolseam: "), done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.mark.parametrize("address", ["0.0.0.0", "[::]", "192.0.2.1"])
def test_a_non_loopback_address_without_a_token_refuses_to_start(tmp_path: Path,
                                                                 address: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TOOLSEAM_MCP_TOKEN"}
    done = run_mcp("--http", f"{address}:{free_port()}", "--base-dir", str(tmp_path), env=env)
    assert_one_line_exit_2(done, "refusing", "not a loopback address", "--auth-token-file",
                           "TOOLSEAM_MCP_TOKEN")


@pytest.mark.parametrize(("token", "mode", "words"), [
    ("short", 0o600, ("at least 32",)),
    ("a" * 64, 0o644, ("other users", "chmod 600")),
    ("two words " + "b" * 64, 0o600, ("one line", "without spaces")),
], ids=["short", "readable-by-others", "with-spaces"])  # fixed ids: xdist workers must collect alike
def test_a_bad_token_refuses_to_start(tmp_path: Path, token: str, mode: int,
                                      words: tuple[str, ...]) -> None:
    path = token_file(tmp_path, token, mode)
    done = run_mcp("--http", f"127.0.0.1:{free_port()}", "--auth-token-file", str(path))
    assert_one_line_exit_2(done, "--auth-token-file", *words)
    assert token not in done.stderr


def test_http_says_where_it_listens_and_where_its_generated_token_is(tmp_path: Path) -> None:
    """No token given: one is generated into an owner-only file (mode 0600, directory 0700)
    whose path — never the token — the start-up line names; removed when the server stops."""
    log = tmp_path.parent / f"{tmp_path.name}.log"
    env = {k: v for k, v in os.environ.items() if k != "TOOLSEAM_MCP_TOKEN"}
    with log.open("wb") as out:
        process = subprocess.Popen([*TOOLSEAM, "mcp", "--http", "127.0.0.1:0", "--base-dir",
                                    str(tmp_path)], stdout=subprocess.DEVNULL, stderr=out, env=env)
    try:
        deadline = time.monotonic() + 30
        while not log.read_text() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        found = re.fullmatch(r"toolseam mcp: listening on http://127\.0\.0\.1:(\d+)/mcp "
                             r"\(bearer token required: generated into (/\S+\.token), readable "
                             r"by this user only; clients send 'Authorization: Bearer <the "
                             r"file's line>'\)\n", log.read_text())
        assert found, log.read_text()
        token_path = Path(found[2])
        assert stat.S_IMODE(token_path.stat().st_mode) == 0o600
        assert stat.S_IMODE(token_path.parent.stat().st_mode) == 0o700
        token = token_path.read_text().strip()
        assert len(token) == 64 and token not in log.read_text()
        url = f"http://127.0.0.1:{found[1]}/mcp"
        assert_refused(url, {})
        response = httpx.post(url, headers={**HEADERS, "Authorization": f"Bearer {token}"},
                              json=INIT, timeout=10)
        assert response.status_code != 401
    finally:
        stop(process)
    assert not token_path.exists()


def test_a_taken_port_is_one_line(tmp_path: Path) -> None:
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log")
    try:
        port = url.split(":")[2].split("/")[0]
        done = run_mcp("--http", f"127.0.0.1:{port}", "--base-dir", str(tmp_path))
        assert_one_line_exit_2(done, f"cannot listen on 127.0.0.1:{port}")
    finally:
        stop(process)


@pytest.mark.parametrize("transport", [[], ["--http", "127.0.0.1:0"]])
def test_a_missing_or_non_directory_base_dir_stops_the_server(tmp_path: Path,
                                                              transport: list[str]) -> None:
    missing = tmp_path / "typo"
    assert_one_line_exit_2(run_mcp(*transport, "--base-dir", str(missing)),
                           f"--base-dir {missing} does not exist on this host")
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert_one_line_exit_2(run_mcp(*transport, "--base-dir", str(a_file), "--confine"),
                           f"--base-dir {a_file} is not a directory on this host")


def test_a_missing_workspace_stops_a_container_server(tmp_path: Path) -> None:
    env = {**os.environ, "TOOLSEAM_DOCKER_URL": "unix:///nonexistent/docker.sock"}
    assert_one_line_exit_2(run_mcp("--backend", "docker", "--workspace", str(tmp_path / "typo"),
                                   env=env), f"--workspace {tmp_path / 'typo'} does not exist on this host")


def test_a_token_without_http_is_a_usage_error(tmp_path: Path) -> None:
    path = token_file(tmp_path, secrets.token_hex(32))
    assert_one_line_exit_2(run_mcp("--auth-token-file", str(path)), "--auth-token-file needs --http")


def test_a_port_out_of_range_is_one_line() -> None:
    assert_one_line_exit_2(run_mcp("--http", "127.0.0.1:99999"), "a port is 0-65535")
