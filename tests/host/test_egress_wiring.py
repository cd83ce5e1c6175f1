"""Egress reaches every surface: the CLI flags, ``serve --stdio``'s egress ops, MCP log
notifications, and the checks at open (host backend; the in-sandbox behaviour on every backend
is tests/backends/test_egress_sandbox.py)."""

from __future__ import annotations

import http.server
import json
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from toolseam import Toolkit
from toolseam.backends.host import HostBackend
from toolseam.seam.errors import ConfigurationError, CouldNotRunError

from ..support.cli import Server, run


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"hello through the tunnel\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        return None


@pytest.fixture(scope="module")
def web() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _config(tmp_path: Path) -> Path:
    """Egress mode with web.test pinned to this machine's loopback (the tests' upstream)."""
    config = tmp_path / "egress.toml"
    config.write_text('egress_private = true\negress_resolve = { "web.test" = "127.0.0.1" }\n'
                      '[limits]\nnetwork = "egress"\n')
    return config


def _fetch(url: str) -> str:
    """A command that fetches ``url`` through the proxy the environment names."""
    return (f"python3 -c 'import urllib.request as u; print(u.urlopen(\"{url}\").read().decode(), "
            "end=\"\")'")


def test_egress_allow_without_network_egress_is_refused_naming_the_flag(tmp_path: Path) -> None:
    done = run("call", "bash", '{"command": "true"}', "--base-dir", str(tmp_path),
               "--egress-allow", "pypi.org")
    assert done.returncode == 2, done.stderr
    assert "--egress-allow: for a sandbox whose network is 'egress' only" in done.stderr
    assert "set --network egress" in done.stderr
    bad = run("call", "bash", '{"command": "true"}', "--base-dir", str(tmp_path),
              "--network", "egress", "--egress-allow", "https://pypi.org")
    assert bad.returncode == 2
    assert "'https://pypi.org': a rule is HOST or HOST:PORT, not a URL" in bad.stderr


def test_serve_streams_each_connection_as_an_egress_op(tmp_path: Path, web: int) -> None:
    with Server("--base-dir", str(tmp_path), "--config", str(_config(tmp_path)),
                "--network", "egress", "--egress-allow", f"web.test:{web}") as server:
        server.send({"id": 1, "tool": "bash", "args": {"command": _fetch(f"http://web.test:{web}/")
                                                       + "; " + _fetch(f"http://other.test:{web}/")
                                                       + " 2>/dev/null; true"}})
        seen = server.read_until(lambda m: m.get("id") == 1)
        server.send({"op": "close"})
        server.read_until(lambda m: m.get("op") == "closed")
        assert server.finish() == 0
    egress = [m for m in seen if m.get("op") == "egress"]
    assert [(e["host"], e["port"], e["allowed"], e["status"]) for e in egress] == [
        ("web.test", web, True, 200), ("other.test", web, False, 403)]
    assert egress[1]["reason"] == "not in egress_allow"
    result = seen[-1]["result"]
    assert result["output"] == "hello through the tunnel\n"
    assert [e["host"] for e in result["metadata"]["egress"]] == ["web.test", "other.test"]


async def test_mcp_sends_egress_events_as_log_notifications(tmp_path: Path, web: int) -> None:
    logs: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logs.append(params)

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "toolseam.frontends.cli", "mcp", "--base-dir", str(tmp_path), "--config",
              str(_config(tmp_path)), "--egress-allow", f"web.test:{web}"],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    async with Client(params, logging_callback=on_log, log_level="info") as client:
        result = await client.call_tool("bash", {"command": _fetch(f"http://web.test:{web}/")})
    assert result.content[0].text == "hello through the tunnel\n"  # type: ignore[union-attr]
    egress = [log for log in logs if log.logger == "egress"]
    assert len(egress) == 1
    assert isinstance(egress[0].data, dict)
    assert (egress[0].data["host"], egress[0].data["status"]) == ("web.test", 200)
    assert result.structured_content is not None
    assert json.dumps(result.structured_content["metadata"]["egress"][0]["host"]) == '"web.test"'


async def test_a_backend_made_for_another_network_is_refused_at_open(tmp_path: Path) -> None:
    egress = {"limits": {"network": "egress"}}
    with pytest.raises(ConfigurationError, match=re.escape(
            "made with network 'host' but the settings say limits.network = 'egress'")):
        await Toolkit(HostBackend(str(tmp_path)), settings=egress).open()
    with pytest.raises(ConfigurationError, match=re.escape(
            "made with network 'egress' but the settings say limits.network = 'none'")):
        await Toolkit(HostBackend(str(tmp_path), network="egress")).open()
    with pytest.raises(ConfigurationError, match="pid_namespace=False cannot have it"):
        HostBackend(str(tmp_path), network="egress", pid_namespace=False)


async def test_host_egress_without_namespaces_is_refused_never_unenforced(tmp_path: Path) -> None:
    """A host that cannot make the namespaces (here: no ``unshare`` on PATH) refuses egress
    at open, rather than run commands on the host's network."""
    empty = tmp_path / "bin"
    empty.mkdir()
    os.symlink(sys.executable, empty / "python3")
    old = os.environ["PATH"]
    os.environ["PATH"] = str(empty)
    try:
        tools = Toolkit("host", base_dir=tmp_path, settings={"limits": {"network": "egress"}})
        with pytest.raises(CouldNotRunError, match="network 'egress' needs a user, pid and "
                                                   "network namespace"):
            await tools.open()
    finally:
        os.environ["PATH"] = old


async def test_host_egress_commands_see_loopback_alone(tmp_path: Path, web: int) -> None:
    settings = {"limits": {"network": "egress"}}
    async with Toolkit("host", base_dir=tmp_path, settings=settings) as tools:
        seen = await tools.call("bash", {"command": "cat /proc/net/dev"})
        direct = await tools.call("bash", {"command": "python3 -c 'import socket; "
                                  f"socket.create_connection((\"127.0.0.1\", {web}), 2)'"})
        assert tools.egress_log() == []
    interfaces = [line.split(":")[0].strip() for line in seen.output.splitlines()[2:]]
    assert interfaces == ["lo"]
    assert direct.is_error and "Connection refused" in direct.output


def test_inspect_config_limits_and_settings_are_validated_whole() -> None:
    from toolseam.frontends.inspect._config import ToolseamSandboxConfig
    from toolseam.frontends.inspect._provider import session_settings

    made = session_settings(ToolseamSandboxConfig(
        backend="host", limits={"network": "egress"}, settings={"egress_allow": ["pypi.org"]}))
    assert (made.limits.network, made.egress_allow) == ("egress", ["pypi.org"])
    with pytest.raises(ConfigurationError, match="egress_allow: for a sandbox whose network is "):
        session_settings(ToolseamSandboxConfig(backend="host",
                                               settings={"egress_allow": ["pypi.org"]}))


async def test_host_egress_hides_run_and_no_command_can_uncover_it(tmp_path: Path) -> None:
    """A network namespace does not hide unix sockets: /run holds the engines' APIs (a command
    could start a container on the host's network), D-Bus and the resolvers. In egress mode it
    is an empty tmpfs that not even a root command can unmount."""
    assert Path("/run").is_dir() and any(Path("/run").iterdir())  # the host's is not empty
    async with Toolkit("host", base_dir=tmp_path,
                       settings={"limits": {"network": "egress"}}) as tools:
        listing = await tools.call("bash", {"command": "ls -A /run /var/run; echo done"})
        uncover = await tools.call("bash", {"command": (
            "umount -l /run 2>/dev/null; python3 -c 'import ctypes, os; libc = ctypes.CDLL(None, "
            "use_errno=True); print(libc.umount2(b\"/run\", 2), os.strerror(ctypes.get_errno()))'"
            "; ls -A /run")})
        engine = await tools.call("bash", {"command": "python3 -c 'import socket; s = socket."
                                  "socket(socket.AF_UNIX); s.connect(\"/var/run/docker.sock\")'"})
    assert listing.output.splitlines() == ["/run:", "", "/var/run:", "done"]
    refused, *left = uncover.output.splitlines()
    assert refused in ("-1 Invalid argument", "-1 Operation not permitted")
    assert set(left) <= {"mount"}  # util-linux's umount may leave its lock dir in our tmpfs
    assert "FileNotFoundError" in engine.output


async def test_a_credential_variable_never_reaches_a_command(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The credential's variable (a name the secret filter does not know) and any variable
    holding its value are dropped from the commands' environment, whatever their source."""
    monkeypatch.setenv("UPSTREAM_HDR", "Bearer t0ken-5ecret-value")
    monkeypatch.setenv("COPY_OF_IT", "x Bearer t0ken-5ecret-value y")
    settings = {"limits": {"network": "egress"}, "egress_allow": ["web.test"],
                "env_allow": ["COPY_OF_IT"],
                "egress_credentials": [{"host": "web.test", "header": "Authorization",
                                        "value_env": "UPSTREAM_HDR"}]}
    async with Toolkit("host", base_dir=tmp_path, settings=settings,
                       env_extra={"EXTRA": "Bearer t0ken-5ecret-value"}) as tools:
        seen = await tools.call("bash", {"command": "env; cat /proc/*/environ 2>/dev/null | "
                                         "tr '\\0' '\\n'"})
        assert "CURL_CA_BUNDLE" in tools.services.command_env
    assert "t0ken-5ecret" not in seen.output and "UPSTREAM_HDR" not in seen.output
    assert "SSL_CERT_FILE=" in seen.output


async def test_the_audit_log_keeps_the_newest_and_calls_do_not_copy_it(tmp_path: Path,
                                                                         web: int) -> None:
    """A sandbox opening connections in a loop must not grow this process without bound:
    egress_log() keeps egress_log_kept events; on_egress still sees every one."""
    settings = {"limits": {"network": "egress"}, "egress_allow": [f"web.test:{web}"],
                "egress_resolve": {"web.test": "127.0.0.1"}, "egress_private": True,
                "egress_log_kept": 3}
    streamed: list[str] = []
    async with Toolkit("host", base_dir=tmp_path, settings=settings) as tools:
        tools.on_egress = lambda event: streamed.append(event.host)
        fetches = "; ".join([_fetch(f"http://web.test:{web}/")] * 4
                            + [_fetch(f"http://n{i}.test:{web}/") + " 2>/dev/null" for i in range(2)])
        result = await tools.call("bash", {"command": fetches + "; true"})
        kept = [event.host for event in tools.egress_log()]
    assert streamed == ["web.test"] * 4 + ["n0.test", "n1.test"]
    assert kept == ["web.test", "n0.test", "n1.test"]
    assert [e["host"] for e in result.metadata["egress"]] == kept
