"""Egress from inside real sandboxes (issue 21, point 8): ``limits.network = "egress"`` on the
host backend (its own user + network namespace), podman rootful and rootless, docker, and the
remote engines in copy mode (tcp, TLS; and over ssh) — one sandbox per backend for the module.

Commands inside run ``tests/support/egress_client.py`` (the test image has python3 alone: no
curl, git or pip; the host backend uses the real ones too). Every upstream is a real server on
the host's 127.0.0.1 (``tests/support/egress_servers.py``), reached by names pinned with
``egress_resolve``. Nothing is sent anywhere else: isolation is proven by listeners on the
host's 127.0.0.1 that must see nothing, and by route lookups (a UDP ``connect`` sends no
packet) that must fail.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolseam import Toolkit, ToolResult
from toolseam.egress import EgressEvent
from toolseam.policy.limits import SandboxLimits
from toolseam.seam.errors import ConfigurationError

from ..support.egress_servers import (
    Seen,
    Streams,
    Trap,
    UpstreamCA,
    closed_port,
    git_handler,
    make_bare_repo,
    make_index,
    make_npm_registry,
    make_test_ca,
    serve,
    sized_server,
    static_handler,
    stream_server,
    tcp_trap,
    udp_trap,
    web_server,
)
from ..support.engines import (
    EVERY_BACKEND,
    backend,
    endpoint,
    remote_image,
    remove_shared,
    required_env,
    shared_dir,
)
from ..support.processes import host_survivors
from ..support.timing import patience

pytestmark = pytest.mark.asyncio(loop_scope="module")

BACKENDS = EVERY_BACKEND
CLIENT = Path(__file__).parents[1] / "support" / "egress_client.py"
NAMES = ("web.test", "secure.test", "tls.test", "git.test", "pypi.test", "sized.test",
         "down.test", "other.test", "stream.test", "npm.test")
# Not secret-looking by name or value: the host backend's environment filter would pass them,
# so only egress itself can keep them out of the sandbox.
CREDENTIAL_ENV, GIT_CREDENTIAL_ENV, NPM_CREDENTIAL_ENV = (
    "EGRESS_UPSTREAM_HEADER", "EGRESS_GIT_HEADER", "EGRESS_NPM_HEADER")


@dataclass(repr=False)  # its servers and records: no repr of them in a failure report
class Upstreams:
    ca: UpstreamCA
    web_seen: Seen
    secure_seen: Seen
    web: int
    secure: int
    git: int
    pypi: int
    sized: int
    down: int
    stream: int
    streams: Streams
    tcp: Trap
    udp: Trap
    secret: str
    git_secret: str
    npm: int
    npm_seen: Seen
    npm_secret: str

    # hypothesis prints a dataclass's fields whatever its repr says; a falsifying example's
    # report then ran to 117 kB, hypothesis raised on that and hid the failure (rehearsal 19)
    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text("<the test's upstream servers>")

    def pins(self) -> dict[str, str]:
        return dict.fromkeys(NAMES, "127.0.0.1")

    def settings(self, **extra: Any) -> dict[str, Any]:
        return {"limits": {"network": "egress"},
                "egress_allow": [f"web.test:{self.web}", f"secure.test:{self.secure}",
                                 f"tls.test:{self.secure}", f"git.test:{self.git}",
                                 f"pypi.test:{self.pypi}", f"sized.test:{self.sized}",
                                 f"down.test:{self.down}", f"stream.test:{self.stream}",
                                 f"npm.test:{self.npm}"],
                "egress_resolve": self.pins(), "egress_private": True,
                "egress_ca_file": str(self.ca.ca_file),
                "egress_credentials": [
                    {"host": "secure.test", "header": "Authorization", "value_env": CREDENTIAL_ENV},
                    {"host": "git.test", "header": "Authorization", "value_env": GIT_CREDENTIAL_ENV},
                    {"host": "npm.test", "header": "Authorization", "value_env": NPM_CREDENTIAL_ENV}],
                **extra}


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    root = tmp_path_factory.mktemp("upstreams")
    ca = make_test_ca(root / "ca", ["secure.test", "tls.test", "git.test", "npm.test"])
    secret = f"Bearer egress-{uuid.uuid4().hex}"
    git_secret = "Basic " + base64.b64encode(f"git:{uuid.uuid4().hex}".encode()).decode()
    npm_secret = f"Bearer npm-{uuid.uuid4().hex}"
    registry = make_npm_registry(root / "npm", "https://npm.test")
    make_bare_repo(root / "git")
    index = make_index(root / "index")
    web_seen, secure_seen, npm_seen, streams = Seen(), Seen(), Seen(), Streams()
    with pytest.MonkeyPatch.context() as patch, ExitStack() as stack:
        patch.setenv(CREDENTIAL_ENV, secret)
        patch.setenv(GIT_CREDENTIAL_ENV, git_secret)
        patch.setenv(NPM_CREDENTIAL_ENV, npm_secret)
        yield Upstreams(
            ca=ca, web_seen=web_seen, secure_seen=secure_seen,
            web=stack.enter_context(web_server(web_seen)),
            secure=stack.enter_context(web_server(secure_seen, tls=ca, secret_header="Authorization",
                                                  secret=secret)),
            git=stack.enter_context(serve(git_handler(root / "git", "Authorization", git_secret), tls=ca)),
            pypi=stack.enter_context(serve(static_handler(index))),
            sized=stack.enter_context(sized_server()), down=closed_port(),
            stream=stack.enter_context(stream_server(streams)), streams=streams,
            tcp=stack.enter_context(tcp_trap()), udp=stack.enter_context(udp_trap()),
            secret=secret, git_secret=git_secret, npm_seen=npm_seen, npm_secret=npm_secret,
            npm=stack.enter_context(serve(static_handler(registry, npm_seen), tls=ca)))


def make_toolkit(name: str, host_dir: Path, settings_: dict[str, Any]) -> Toolkit:
    if name == "host":
        return Toolkit("host", base_dir=host_dir, settings=settings_)
    return Toolkit(backend(name, str(host_dir), limits=SandboxLimits(network="egress")),
                   settings=settings_)


@dataclass(repr=False)
class Box:
    """One open egress session and what its calls answered (searched for the secrets)."""

    name: str
    tk: Toolkit = field(repr=False)
    host_dir: Path = field(repr=False)
    python: str = field(repr=False)
    results: list[ToolResult] = field(default_factory=list, repr=False)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # as Upstreams's, above
        printer.text(f"<an egress session on {self.name}>")

    async def call(self, tool: str, args: dict[str, Any]) -> ToolResult:
        result = await self.tk.call(tool, args)
        self.results.append(result)
        return result

    async def bash(self, command: str, timeout_ms: int = 120_000) -> str:
        result = await self.call("bash", {"command": command, "timeout": timeout_ms})
        assert not result.is_error, (self.name, command[:200], result.output)
        return result.output

    async def client(self, command: str, **args: Any) -> Any:
        """``egress_client.py COMMAND ARGS`` inside; its JSON answer."""
        out = await self.bash(f"{self.python} egress_client.py {command} {shlex.quote(json.dumps(args))}")
        return json.loads(out.strip().splitlines()[-1])

    def log(self) -> list[EgressEvent]:
        return self.tk.egress_log()

    async def settled(self, count: int) -> list[EgressEvent]:
        """The log once it holds ``count`` events (a client may have its whole answer a moment
        before the proxy's handler records the end)."""
        for _ in range(200):
            if len(self.log()) >= count:
                break
            await asyncio.sleep(0.05)
        return self.log()


async def open_box(name: str, upstreams: Upstreams, **extra: Any) -> Box:
    host_dir = shared_dir()
    tk = make_toolkit(name, host_dir, upstreams.settings(**extra))
    try:
        await tk.open()
    except BaseException:
        remove_shared(host_dir)
        raise
    box = Box(name, tk, host_dir, sys.executable if name == "host" else "python3")
    written = await box.call("write", {"path": "egress_client.py", "content": CLIENT.read_text()})
    assert not written.is_error, written.output
    await box.call("write", {"path": "upstream-ca.pem", "content": upstreams.ca.ca_file.read_text()})
    return box


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def box(request: pytest.FixtureRequest, upstreams: Upstreams) -> AsyncIterator[Box]:
    made = await open_box(request.param, upstreams)
    try:
        yield made
    finally:
        await made.tk.close()
        remove_shared(made.host_dir)


def url(host: str, port: int, path: str = "/", scheme: str = "http") -> str:
    return f"{scheme}://{host}:{port}{path}"


# -- what gets through, and what does not -------------------------------------------------------
async def test_allowed_hosts_answer_and_commands_are_told_the_proxy(box: Box, upstreams: Upstreams) -> None:
    env = dict(line.split("=", 1) for line in (await box.bash("env")).splitlines() if "=" in line)
    proxy = env["HTTP_PROXY"]
    assert proxy.startswith("http://127.0.0.1:")
    assert all(env[v] == proxy for v in ("HTTPS_PROXY", "http_proxy", "https_proxy"))
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1"
    bundle = env["SSL_CERT_FILE"]
    assert all(env[v] == bundle for v in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
                                          "GIT_SSL_CAINFO", "PIP_CERT"))
    before = len(box.log())
    plain = await box.client("get", url=url("web.test", upstreams.web, "/plain?x=1"))
    assert plain["status"] == 200 and '"path": "/plain?x=1"' in plain["body"], plain
    # HTTPS to a host without credentials: a plain tunnel, the client sees the server's own
    # certificate (it trusts the test CA alone).
    tunnelled = await box.client("get", url=url("tls.test", upstreams.secure, "/tunnelled", "https"),
                                 cafile="upstream-ca.pem")
    assert tunnelled["status"] == 200 and '"path": "/tunnelled"' in tunnelled["body"], tunnelled
    events = (await box.settled(before + 2))[before:]
    assert [(e.host, e.kind, e.allowed, e.status, e.address, e.intercepted) for e in events] == [
        ("web.test", "http", True, 200, "127.0.0.1", False),
        ("tls.test", "connect", True, 200, "127.0.0.1", False)]


async def test_a_refused_host_gets_a_403_naming_the_setting(box: Box, upstreams: Upstreams) -> None:
    seen_before = len(upstreams.web_seen.paths)
    before = len(box.log())
    answer = await box.client("get", url=url("other.test", upstreams.web, "/nope"))
    assert answer["status"] == 403, answer
    assert f"refused other.test:{upstreams.web}: not in egress_allow" in answer["body"]
    assert f'egress_allow = ["other.test:{upstreams.web}"]' in answer["body"]
    tunnel = await box.client("get", url=url("other.test", 443, "/", "https"))
    assert tunnel["status"] is None and "403" in tunnel["error"], tunnel
    events = (await box.settled(before + 2))[before:]
    assert [(e.host, e.port, e.allowed, e.status, e.address) for e in events] == [
        ("other.test", upstreams.web, False, 403, None), ("other.test", 443, False, 403, None)]
    assert len(upstreams.web_seen.paths) == seen_before


async def test_ip_literals_are_refused(box: Box, upstreams: Upstreams) -> None:
    # NO_PROXY keeps ordinary clients off the proxy for 127.0.0.1 (they then find nothing
    # there, see test_raw_tcp_udp_and_dns_find_no_way_out): these requests go to the proxy.
    seen_before = len(upstreams.web_seen.paths)
    before = len(box.log())
    port = upstreams.web
    for request in (f"GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                    f"GET http://[::1]:{port}/ HTTP/1.1\r\n\r\n",
                    f"GET http://2130706433:{port}/ HTTP/1.1\r\n\r\n",
                    f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n",
                    "CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n"):
        answer = (await box.client("raw", request=request))["answer"]
        assert answer.startswith("HTTP/1.1 403 Forbidden"), (request, answer)
        if "2130706433" not in request:
            assert "listed literally in egress_allow" in answer, answer
    assert 'egress_allow = ["169.254.169.254:80"]' in answer
    events = (await box.settled(before + 5))[before:]
    assert [(e.allowed, e.status, e.address) for e in events] == [(False, 403, None)] * 5
    assert len(upstreams.web_seen.paths) == seen_before


def _host_addresses() -> list[str]:
    """This machine's own non-loopback addresses (a route to them must not exist inside)."""
    found = []
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family.name in ("AF_INET", "AF_INET6") and not address.address.startswith(
                    ("127.", "::1", "fe80")):
                found.append(address.address.split("%")[0])
    return found


def _engine_sockets() -> list[str]:
    """The unix sockets of the engines on this machine (each a way to a container on any
    network, were it reachable from inside)."""
    paths = {"/var/run/docker.sock", "/run/docker.sock"}
    for variable in ("TOOLSEAM_PODMAN_URL", "TOOLSEAM_PODMAN_ROOTLESS_URL", "TOOLSEAM_DOCKER_URL"):
        value = os.environ.get(variable, "")
        if value.startswith("unix://"):
            paths.add(value.removeprefix("unix://"))
    return sorted(path for path in paths if os.path.exists(path))


async def test_raw_tcp_udp_and_dns_find_no_way_out(box: Box, upstreams: Upstreams) -> None:
    addresses = ["169.254.169.254", "10.0.0.1", "192.168.1.1", "1.1.1.1", "2001:4860:4860::8888",
                 "fd00::1", *_host_addresses()]
    before = len(box.log())
    engine_sockets = _engine_sockets()
    found = await box.client("probe", tcp_port=upstreams.tcp.port, udp_port=upstreams.udp.port,
                             addresses=addresses, unix_paths=engine_sockets)
    assert found["interfaces"] == ["lo"], found
    # The engines' API sockets on this machine: absent inside (the host backend hides /run).
    assert engine_sockets and all(why.startswith(("FileNotFoundError", "PermissionError"))
                                  for why in found["unix"].values()), found["unix"]
    # The host's listener on 127.0.0.1 is not the sandbox's 127.0.0.1: refused, and never reached.
    assert found["tcp"].startswith("ConnectionRefusedError"), found
    assert found["udp_sent"] == "ok"  # a datagram to the sandbox's own loopback goes nowhere
    assert set(found["routes"]) >= set(addresses)
    # No route (ENETUNREACH), or for IPv6 where the sandbox has none at all, no address to
    # send from (EADDRNOTAVAIL) or no such family: never "ok".
    assert all(why.startswith("OSError: [Errno") and any(
        reason in why for reason in ("unreachable", "Cannot assign", "not supported"))
        for where, why in found["routes"].items() if where in addresses), found["routes"]
    # The one resolver is the agent's, on the sandbox's own loopback (captured connections);
    # it answers a name no rule allows as one that does not exist.
    assert found["nameservers"] == ["127.0.0.53"], found
    assert "dns" in found and found["dns"].startswith("gaierror"), found
    await asyncio.sleep(0.3)
    assert upstreams.tcp.hits == [] and upstreams.udp.hits == []
    # nothing of it went through the proxy: the refused lookup alone is audited
    assert [(e.kind, e.host, e.allowed) for e in box.log()[before:]] == [("dns", "pypi.org", False)]


async def test_upstream_down_gives_a_502_naming_the_reason(box: Box, upstreams: Upstreams) -> None:
    before = len(box.log())
    answer = await box.client("get", url=url("down.test", upstreams.down))
    assert answer["status"] == 502, answer
    assert (f"could not reach down.test:{upstreams.down}: could not connect "
            "(127.0.0.1: Connection refused)") in answer["body"]
    [event] = (await box.settled(before + 1))[before:]
    assert (event.allowed, event.status, event.address) == (True, 502, None)
    assert "Connection refused" in event.reason


# -- credentials stay outside -----------------------------------------------------------------
async def test_a_credential_reaches_the_upstream_and_never_the_sandbox(box: Box,
                                                                       upstreams: Upstreams) -> None:
    before = len(box.log())
    # The client sends a forged credential: it is replaced outside, not passed on.
    answer = await box.client("get", url=url("secure.test", upstreams.secure, "/private", "https"))
    assert answer == {"status": 200, "body": "authorized\n", "size": 11}, answer
    assert upstreams.secure_seen.requests[-1]["authorization"] == upstreams.secret
    [event] = (await box.settled(before + 1))[before:]
    assert (event.kind, event.allowed, event.status, event.intercepted) == ("connect", True, 200, True)
    bundle = (await box.bash('cat "$SSL_CERT_FILE"'))
    assert bundle.count("BEGIN CERTIFICATE") >= 1 and "PRIVATE KEY" not in bundle
    assert "toolseam" not in bundle or "BEGIN CERTIFICATE" in bundle
    ca_dir = (await box.bash('dirname "$SSL_CERT_FILE"')).strip()
    roots = [str(box.host_dir), ca_dir, "/dev/shm"] if box.name == "host" else ["/"]
    hidden = {"secret_reversed_b64": "", "roots": roots}
    for secret in (upstreams.secret, upstreams.git_secret, upstreams.npm_secret):
        hidden["secret_reversed_b64"] = base64.b64encode(secret.encode()[::-1]).decode()
        found = await box.client("scan", **hidden)
        assert found["hits"] == [], (box.name, found["hits"])
        assert found["processes"] >= 2 and found["files"] >= 1
    assert all(upstreams.secret not in r.output + json.dumps(r.metadata) for r in box.results)
    assert all(upstreams.secret not in repr(e) for e in box.log())


async def test_an_upstream_that_shows_the_request_does_not_hand_the_credential_inside(
        box: Box, upstreams: Upstreams) -> None:
    """The credential host answers with the request's own headers (a reflecting endpoint, and
    TRACE): the injected value must not come back into the sandbox through the answer."""
    private = upstreams.secret.split()[-1]
    reflected = await box.client("get", url=url("secure.test", upstreams.secure, "/reflect", "https"))
    traced = await box.client("get", url=url("secure.test", upstreams.secure, "/trace", "https"),
                              method="TRACE")
    assert reflected["status"] == 200 and "Host" in reflected["body"], reflected
    assert private not in reflected["body"], "the credential came back inside in a reflected body"
    assert private not in json.dumps(traced), "the credential came back inside in a TRACE answer"


async def test_git_over_https_with_the_injected_credential(box: Box, upstreams: Upstreams) -> None:
    git_url = url("git.test", upstreams.git, "/repo.git", "https")
    if box.name == "host":  # the real git, reading the proxy and GIT_SSL_CAINFO from the env
        out = await box.bash(f"GIT_TERMINAL_PROMPT=0 git clone -q {git_url} cloned && cat cloned/README"
                             " && cat cloned/.git/config")
        assert out.startswith("hello egress\n")
        assert upstreams.git_secret not in out
    else:  # no git in the image: git's first smart-HTTP request, as git makes it
        answer = await box.client("get", url=git_url + "/info/refs?service=git-upload-pack")
        assert answer["status"] == 200, answer
        assert "# service=git-upload-pack" in answer["body"] and "refs/heads/main" in answer["body"]
    assert upstreams.git_secret not in json.dumps([dataclasses.asdict(e) for e in box.log()])


async def test_pip_download_from_the_local_index(box: Box, upstreams: Upstreams,
                                                 tmp_path: Path) -> None:
    index = url("pypi.test", upstreams.pypi, "/simple")
    args = (f"download --no-deps --no-cache-dir --disable-pip-version-check --index-url {index} "
            f"--trusted-host pypi.test:{upstreams.pypi} -d wheels tiny-egress")
    if box.name == "host":
        command = f"PIP_CONFIG_FILE=/dev/null {box.python} -m pip {args}"
    else:  # the image has no pip: the host venv's own (pure Python, same 3.11) goes in
        import pip

        shutil.copytree(Path(pip.__file__).parent, tmp_path / "pip",
                        ignore=shutil.ignore_patterns("__pycache__"))
        await box.bash("mkdir -p pylib")
        await box.tk.upload(str(tmp_path / "pip"), "pylib/pip")
        command = f"PIP_CONFIG_FILE=/dev/null PYTHONPATH=pylib python3 -m pip {args}"
    before = len(box.log())
    out = await box.bash(command + " && ls wheels")
    assert out.rstrip().endswith("tiny_egress-1.0-py3-none-any.whl"), out
    events = (await box.settled(before + 2))[before:]
    assert {(e.host, e.port, e.allowed, e.status) for e in events} == {
        ("pypi.test", upstreams.pypi, True, 200)}


# -- audit -----------------------------------------------------------------------------------
async def test_audit_events_are_exact_in_the_log_the_stream_and_the_call_metadata(
        box: Box, upstreams: Upstreams) -> None:
    streamed: list[EgressEvent] = []
    box.tk.on_egress = streamed.append
    before = len(box.log())
    script = (f"{box.python} egress_client.py sized "
              + shlex.quote(json.dumps({"host": "sized.test", "port": upstreams.sized, "up": 1000,
                                        "down": 5000}))
              + f" && {box.python} egress_client.py get "
              + shlex.quote(json.dumps({"url": url("other.test", 8080)})))
    try:
        result = await box.call("bash", {"command": script})
    finally:
        box.tk.on_egress = None
    assert not result.is_error, result.output
    first, second = (json.loads(line) for line in result.output.splitlines())
    assert first == {"digest_ok": True, "received": 5000, "intact": True}
    assert second["status"] == 403
    events = box.log()[before:]
    # who opened each: the process (pid, argv head), its job and this call
    assert events[0].argv[1:3] == ["egress_client.py", "sized"] and events[0].job is not None
    assert events[0].pid is not None and events[0].call is not None
    assert [{k: v for k, v in dataclasses.asdict(e).items()
             if k not in ("started", "duration_s", "pid", "argv", "job", "call")}
            for e in events] == [
        {"host": "sized.test", "port": upstreams.sized, "kind": "connect", "allowed": True,
         "reason": f"allowed by egress_allow 'sized.test:{upstreams.sized}'", "status": 200,
         "address": "127.0.0.1", "intercepted": False,
         "bytes_up": len("1000 5000\n") + 1000, "bytes_down": 64 + 5000},
        {"host": "other.test", "port": 8080, "kind": "http", "allowed": False,
         "reason": "not in egress_allow", "status": 403,
         "address": None, "intercepted": False, "bytes_up": 0, "bytes_down": 0}]
    assert all(0 <= e.duration_s < 30 and e.started > time.time() - 120 for e in events)
    assert result.metadata["egress"] == [dataclasses.asdict(e) for e in events]
    assert streamed == events
    quiet = await box.call("bash", {"command": "true"})
    assert "egress" not in quiet.metadata


async def test_fifty_connections_at_once(box: Box, upstreams: Upstreams) -> None:
    seen_before = len(upstreams.web_seen.paths)
    before = len(box.log())
    answer = await box.client("many", url=url("web.test", upstreams.web, "/fifty"), count=50)
    assert answer["statuses"] == [200] * 50
    events = (await box.settled(before + 50))[before:]
    assert len(events) == 50 and all(e.allowed and e.status == 200 for e in events)
    assert upstreams.web_seen.paths[seen_before:] == ["/fifty"] * 50


async def test_a_command_opening_connections_in_a_loop_does_not_break_tool_calls(
        box: Box, upstreams: Upstreams) -> None:
    marker = f"loop-{uuid.uuid4().hex[:8]}"
    # the loop runs until the calls are done (a fixed 4 s ended before them under load)
    args = {"seconds": patience(120), "marker": marker, "allowed": f"sized.test:{upstreams.sized}",
            "refused": "other.test:443"}
    hammer = asyncio.ensure_future(box.client("loop", **args))
    try:
        for _ in range(200):
            if not (await box.call("bash", {"command": f"test -e {marker}"})).is_error:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the loop never started")
        slowest = 0.0
        for turn in range(10):
            started = time.monotonic()
            written = await box.call("write", {"path": f"turn{turn}.txt", "content": f"turn {turn}\n"})
            read = await box.call("read", {"path": f"turn{turn}.txt"})
            echoed = await box.call("bash", {"command": f"echo call {turn}"})
            slowest = max(slowest, time.monotonic() - started)
            assert not written.is_error and "turn" in read.output and echoed.output == f"call {turn}\n"
        assert not hammer.done(), "the loop ended before the calls did: nothing was measured"
        assert slowest < patience(10), f"three calls took {slowest:.1f} s while the loop ran"
        await box.call("bash", {"command": f"touch {marker}.stop"})
        counts = await asyncio.wait_for(hammer, patience(60))
    finally:
        if not hammer.done():
            hammer.cancel()
    assert counts["opened"] > 50, counts
    after = await box.client("get", url=url("web.test", upstreams.web, "/after-the-loop"))
    assert after["status"] == 200


# -- bytes through the tunnel, whatever their sizes and cuts ----------------------------------
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(up=st.sampled_from([0, 1, 65535, 65536, 65537, 524288]) | st.integers(0, 3_000_000),
       down=st.sampled_from([0, 1, 65536, 524289]) | st.integers(0, 3_000_000),
       cut=st.none() | st.integers(1, 200_000))
async def test_the_bytes_through_a_tunnel_are_the_bytes_sent(box: Box, upstreams: Upstreams, up: int,
                                                             down: int, cut: int | None) -> None:
    before = len(box.log())
    answer = await box.client("sized", host="sized.test", port=upstreams.sized, up=up, down=down,
                              cut=cut)
    [event] = (await box.settled(before + 1))[before:]
    head = len(f"{up} {down}\n")
    assert event.bytes_up == head + up, (event, up, down, cut)
    if cut is None:
        assert answer == {"digest_ok": True, "received": down, "intact": True}
        assert event.bytes_down == 64 + down
    else:  # the client stopped reading (once the server had every byte it sent and began to
        # answer): it has what it asked for, and the proxy counted no more than the server sent
        assert answer["received"] >= min(cut, 64 + down)
        assert event.bytes_down <= 64 + down


async def test_connections_come_whole_where_the_agent_shares_this_kernel(box: Box,
                                                                        upstreams: Upstreams) -> None:
    """Egress's lane (``toolseam_agent/fd_passing.py``): on the host backend and the local
    engines (bind mode) each connection reaches the proxy as its socket, not as frames on the
    channel; through a remote engine (copy mode) the frames carry it. Either way the bytes are the
    bytes, and no command holds a descriptor of the lane or of another connection."""
    channel = box.tk.backend._agent()  # type: ignore[attr-defined]  # the session's channel
    local = not box.name.endswith("-remote")
    assert (channel.lane is not None) == local, (box.name, channel.lane)
    before = channel.lane.served if channel.lane is not None else 0
    answer = await box.client("sized", host="sized.test", port=upstreams.sized, up=1000,
                              down=3_000_000, cut=None)
    assert answer == {"digest_ok": True, "received": 3_000_000, "intact": True}
    if channel.lane is not None:
        assert channel.lane.served == before + 1
        assert channel.tunnels is not None and channel.tunnels.open_connections == 0
    listing = await box.bash("for fd in /proc/$$/fd/*; do readlink $fd || true; done")
    assert "socket:" not in listing, listing


# -- a session without egress_private ----------------------------------------------------------
async def test_names_pinned_to_non_public_addresses_are_refused(box: Box, upstreams: Upstreams) -> None:
    strict = upstreams.settings(egress_private=False, egress_credentials=[], egress_ca_file=None,
                                egress_allow=["meta.test", f"web.test:{upstreams.web}"],
                                egress_resolve={"meta.test": "169.254.169.254", "web.test": "127.0.0.1"})
    host_dir = shared_dir()
    tk = make_toolkit(box.name, host_dir, strict)
    seen_before = len(upstreams.web_seen.paths)
    try:
        async with tk:
            other = Box(box.name, tk, host_dir, box.python)
            await other.call("write", {"path": "egress_client.py", "content": CLIENT.read_text()})
            meta = await other.client("get", url="http://meta.test/latest/meta-data/")
            assert meta["status"] == 403, meta
            assert "a link-local address" in meta["body"] and "egress_private = true" in meta["body"]
            tunnel = await other.client("get", url="https://meta.test/")
            assert tunnel["status"] is None and "403" in tunnel["error"]
            loop = await other.client("get", url=url("web.test", upstreams.web))
            assert loop["status"] == 403 and "a loopback address" in loop["body"], loop
            env = await other.bash("env")
            assert "toolseam-egress-" not in env  # no credentials: no session CA, no bundle
            events = await other.settled(3)
            assert [(e.host, e.allowed, e.status, e.address) for e in events] == [
                ("meta.test", False, 403, None), ("meta.test", False, 403, None),
                ("web.test", False, 403, None)]
    finally:
        remove_shared(host_dir)
    assert len(upstreams.web_seen.paths) == seen_before


# -- ends ------------------------------------------------------------------------------------
def _engine_cli(name: str) -> list[str]:
    """The engine's own client, pointed at the engine the tests use as ``name``."""
    if name not in ("docker", "docker-remote"):
        return ["podman", "--url", endpoint(name)]
    args = ["docker", "-H", endpoint(name)]
    if name == "docker-remote":
        certs = required_env("TOOLSEAM_REMOTE_DOCKER_CERT_PATH", name)
        args += ["--tlsverify", f"--tlscacert={certs}/ca.pem", f"--tlscert={certs}/cert.pem",
                 f"--tlskey={certs}/key.pem"]
    return args


def _inspect(name: str, container: str, template: str) -> str | None:
    done = subprocess.run([*_engine_cli(name), "container", "inspect", "-f", template, container],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip() if done.returncode == 0 else None


def _sandbox_processes(tk: Toolkit, name: str) -> list[int]:
    """Host pids of the sandbox's processes: its first process (the host agent's launcher, or
    the container's init as the engine reports it — every engine here shares this machine's
    pid namespace) and all its descendants."""
    if name == "host":
        first = tk.backend.agent.launcher_pid  # type: ignore[attr-defined]
    else:
        first = int(_inspect(name, tk.backend.sandbox.container, "{{.State.Pid}}") or 0)  # type: ignore[attr-defined]
    assert first, f"no first process found for the {name} sandbox"
    return [first, *(p.pid for p in psutil.Process(first).children(recursive=True))]


async def test_closing_the_session_ends_its_tunnels_and_leaves_nothing(box: Box,
                                                                       upstreams: Upstreams) -> None:
    host_dir = shared_dir()
    tk = make_toolkit(box.name, host_dir, upstreams.settings(egress_idle_timeout_s=2.0,
                                                             egress_max_connections=3))
    streams = upstreams.streams
    try:
        await tk.open()
        other = Box(box.name, tk, host_dir, box.python)
        await other.call("write", {"path": "egress_client.py", "content": CLIENT.read_text()})
        # More connections at once than egress_max_connections: a 503 naming the limit.
        over = await other.client("over_the_limit", host="sized.test", port=upstreams.sized, hold=3)
        assert over["answer"].startswith("HTTP/1.1 503"), over
        assert "egress_max_connections = 3" in over["answer"], over
        # The proxy ends a tunnel (idle_timeout_s): the client inside sees its connection end.
        stalled = await other.client("stream", url=url("stream.test", upstreams.stream, "/stall"),
                                     progress="stall.txt")
        assert stalled["received"] == 1 << 20, stalled
        for _ in range(100):  # the proxy records the tunnel as its handler ends, just after
            if any(e.host == "stream.test" for e in tk.egress_log()):
                break
            await asyncio.sleep(0.05)
        [idle] = [e for e in tk.egress_log() if e.host == "stream.test"]
        assert [e.status for e in tk.egress_log() if e.host == "sized.test"].count(503) == 1
        assert idle.reason.endswith("ended: no bytes either way for egress_idle_timeout_s = 2 seconds"), idle
        # A download running when the session closes.
        first = len(streams.started)
        marker = f"dl-{uuid.uuid4().hex[:8]}"
        download = asyncio.ensure_future(other.call("bash", {"command": (
            f"{other.python} egress_client.py stream "
            + shlex.quote(json.dumps({"url": url("stream.test", upstreams.stream, f"/stream?{marker}"),
                                      "progress": "progress.txt"})) + f" # {marker}")}))
        for _ in range(400):
            if len(streams.sent) > first and streams.sent[first] > 1 << 20:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the download never got going")
        processes = _sandbox_processes(tk, box.name)
        container = None if box.name == "host" else tk.backend.sandbox.container  # type: ignore[attr-defined]
        assert len(processes) >= 3 and host_survivors(marker), processes  # agent, sh, client
        await asyncio.wait_for(tk.close(), 60)
        assert await asyncio.to_thread(streams.ended[first].wait, 10), "the upstream never saw the end"
        # The call answers. Closing kills the session's jobs and ends its tunnels, in whichever
        # order they reach the client: it saw its connection end (and says how far it got), or
        # it was killed first (and the call says so).
        outcome = await asyncio.wait_for(download, 30)
        if outcome.output.startswith("{"):
            report = json.loads(outcome.output.split("\n", 1)[0])
            assert report["received"] > 1 << 20 and report["how"] == "eof", outcome.output
        else:
            assert outcome.is_error and "exited with code" in outcome.output, outcome
        ended = [e for e in tk.egress_log() if e.host == "stream.test"][-1]
        assert ended.bytes_down > 1 << 20 and ended.reason.endswith("the proxy was closed"), ended
        assert host_survivors(marker) == []
        assert [p for p in processes if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE] == []
        if container is not None:
            assert await asyncio.to_thread(_inspect, box.name, container, "{{.Id}}") is None
    finally:
        await tk.close()
        remove_shared(host_dir)


async def test_a_client_that_distrusts_the_session_ca_fails_alone(box: Box, upstreams: Upstreams) -> None:
    """A client that ignores SSL_CERT_FILE (trusting other roots) fails its handshake with the
    session CA: that connection ends, and the session, its calls and other tunnels go on."""
    host_dir = shared_dir()
    try:
        async with make_toolkit(box.name, host_dir, upstreams.settings()) as tk:
            other = Box(box.name, tk, host_dir, box.python)
            await other.call("write", {"path": "egress_client.py", "content": CLIENT.read_text()})
            await other.call("write", {"path": "upstream-ca.pem",
                                       "content": upstreams.ca.ca_file.read_text()})
            refused = await other.client("get", url=url("secure.test", upstreams.secure, "/", "https"),
                                         cafile="upstream-ca.pem")
            assert refused["status"] is None and "CERTIFICATE_VERIFY_FAILED" in refused["error"], refused
            assert (await other.call("bash", {"command": "echo alive"})).output == "alive\n"
            trusted = await other.client("get", url=url("secure.test", upstreams.secure, "/private", "https"))
            assert trusted["status"] == 200 and trusted["body"] == "authorized\n", trusted
            events = await other.settled(2)
            assert [(e.host, e.allowed, e.intercepted) for e in events] == [
                ("secure.test", True, True), ("secure.test", True, True)]
            assert events[1].status == 200
    finally:
        remove_shared(host_dir)


# -- the real clients and the docs' recipes, on the host backend -----------------------------
async def test_real_clients_and_the_recipes_on_the_host_backend(upstreams: Upstreams) -> None:
    """curl, npm, pip and git as they are on this machine (the test image has none of them),
    first reading the proxy from the environment, then as docs/network.md's recipes set them
    with the proxy variables removed."""
    host_dir = shared_dir()
    try:
        async with Toolkit("host", base_dir=host_dir, settings=upstreams.settings()) as tk:
            async def sh(command: str) -> str:
                result = await tk.call("bash", {"command": command, "timeout": 120_000})
                assert not result.is_error, (command, result.output)
                assert all(s not in result.output for s in (upstreams.secret, upstreams.npm_secret,
                                                            upstreams.git_secret))
                return result.output

            private = url("secure.test", upstreams.secure, "/private", "https")
            assert await sh(f"curl -sS {private}") == "authorized\n"
            refused = await sh(f"curl -sS -i http://other.test:{upstreams.web}/")
            assert refused.startswith("HTTP/1.1 403") and "egress_allow = [" in refused
            # Around the proxy: an allowed name is captured (it resolves to an address of its
            # own inside), any other does not resolve, the host's 127.0.0.1 is never reached.
            around = await sh(f"curl -sS --noproxy '*' http://web.test:{upstreams.web}/ 2>&1; "
                              f"echo \" exit $?\"; curl -sS --noproxy '*' "
                              f"http://other.test:{upstreams.web}/ 2>&1; echo \" exit $?\"; "
                              f"curl -sS --noproxy '*' http://127.0.0.1:{upstreams.tcp.port}/ "
                              "2>&1; echo \" exit $?\"")
            assert around.startswith('{"path": "/"') and " exit 0" in around, around
            assert "Could not resolve host: other.test" in around and " exit 6" in around, around
            assert " exit 7" in around, around  # connection refused: the sandbox's own loopback
            # npm (11, node 20) reads the proxy from the environment but, through a proxy, does
            # not trust NODE_EXTRA_CA_CERTS: its cafile must name the bundle (docs/network.md).
            registry = f"https://npm.test:{upstreams.npm}/"
            npm = ('HOME=$PWD npm config set cafile "$NODE_EXTRA_CA_CERTS" && '
                   f"HOME=$PWD npm view tiny-egress version --registry {registry}")
            assert (await sh(npm)).strip() == "1.0.0"
            assert upstreams.npm_seen.requests[-1]["authorization"] == upstreams.npm_secret
            # The recipes: the client told by its own setting, the environment's proxy removed.
            unset = "env -u HTTP_PROXY -u HTTPS_PROXY -u http_proxy -u https_proxy"
            recipe = ('HOME=$PWD npm config set proxy "$HTTP_PROXY" && '
                      'HOME=$PWD npm config set https-proxy "$HTTPS_PROXY" && '
                      f"{unset} HOME=$PWD npm view tiny-egress version --registry {registry}")
            assert (await sh(recipe)).strip() == "1.0.0"
            index = url("pypi.test", upstreams.pypi, "/simple")
            pip = (f'{unset} PIP_CONFIG_FILE=/dev/null {sys.executable} -m pip download --proxy '
                   f'"$HTTPS_PROXY" --no-deps --no-cache-dir --disable-pip-version-check '
                   f"--index-url {index} --trusted-host pypi.test:{upstreams.pypi} -d w tiny-egress"
                   " && ls w")
            assert (await sh(pip)).strip().endswith("tiny_egress-1.0-py3-none-any.whl")
            git_url = url("git.test", upstreams.git, "/repo.git", "https")
            git = (f'{unset} GIT_TERMINAL_PROMPT=0 git -c http.proxy="$HTTPS_PROXY" clone -q '
                   f"{git_url} r && cat r/README")
            assert await sh(git) == "hello egress\n"
            hosts = [(e.host, e.allowed) for e in tk.egress_log()]
            assert ("npm.test", True) in hosts and ("pypi.test", True) in hosts
            assert ("git.test", True) in hosts and ("other.test", False) in hosts
    finally:
        remove_shared(host_dir)


# -- settings, once ---------------------------------------------------------------------------
_EGRESS = {"limits": {"network": "egress"}}


@pytest.mark.parametrize(("settings_", "named"), [
    ({"egress_allow": ["pypi.org"]},
     "egress_allow: for a sandbox whose network is 'egress' only (this one's is 'none')"),
    ({"limits": {"network": "bridge"}, "egress_private": True}, "egress_private: for a sandbox"),
    ({**_EGRESS, "egress_alow": ["pypi.org"]}, "egress_alow"),
    ({**_EGRESS, "egress_allow": ["https://x.org"]}, "egress_allow[0] = 'https://x.org'"),
    ({**_EGRESS, "egress_allow": ["ok.org", "*.org"]}, "egress_allow[1]"),
    ({**_EGRESS, "egress_resolve": {"a.test": "localhost"}}, "egress_resolve['a.test'] = 'localhost'"),
    ({**_EGRESS, "egress_credentials": [{"host": "*.x.test", "header": "A", "value_env": "X"}]},
     "egress_credentials.0.host: '*.x.test' is not a host name"),
    ({**_EGRESS, "egress_max_connections": 0}, "egress_max_connections"),
], ids=lambda value: str(value)[:50])
async def test_settings_errors_name_what_is_wrong(settings_: dict[str, Any], named: str) -> None:
    with pytest.raises((ConfigurationError, ValueError)) as caught:
        Toolkit("host", settings=settings_)
    assert named in str(caught.value)


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_errors_found_at_open_leave_nothing(tmp_path: Path) -> None:
    missing = {**_EGRESS, "egress_credentials": [
        {"host": "git.test", "header": "Authorization", "value_env": "EGRESS_NOT_SET_ANYWHERE"}]}
    tk = Toolkit("host", base_dir=tmp_path, settings=missing)
    with pytest.raises(ConfigurationError, match="environment variable EGRESS_NOT_SET_ANYWHERE is "
                                                   "not set in the toolseam process"):
        await tk.open()
    launcher = tk.backend.agent.launcher_pid  # type: ignore[attr-defined]
    assert launcher is None or not psutil.pid_exists(launcher)
    made = backend("docker", str(tmp_path))  # network none, settings egress: they disagree
    with pytest.raises(ConfigurationError, match=re.escape(
            "made with network 'none' but the settings say limits.network = 'egress'")):
        await Toolkit(made, settings=_EGRESS).open()


async def test_the_host_backend_refuses_egress_without_its_namespaces(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="pid_namespace=False"):
        Toolkit("host", base_dir=tmp_path, settings=_EGRESS,
                backend_options={"pid_namespace": False})
    # A host where no network namespace can be made: a user namespace of our own whose limit
    # of network namespaces is 0. The agent's unshare fails there, and open must refuse.
    script = (
        "import asyncio, sys\n"
        "from toolseam import Toolkit\n"
        "async def main():\n"
        f"    tk = Toolkit('host', base_dir={str(tmp_path)!r}, settings={_EGRESS!r})\n"
        "    try:\n"
        "        await tk.open()\n"
        "    except Exception as exc:\n"
        "        print(type(exc).__name__, exc); return\n"
        "    out = await tk.call('bash', {'command': 'cat /proc/net/dev'})\n"
        "    print('OPENED', out.output); await tk.close()\n"
        "asyncio.run(main())\n")
    shell = ("echo 0 > /proc/sys/user/max_net_namespaces && "
             f"exec {shlex.quote(sys.executable)} -c {shlex.quote(script)}")
    done = await asyncio.to_thread(subprocess.run, ["unshare", "--user", "--map-root-user",
                                                    "sh", "-c", shell],
                                   capture_output=True, text=True, timeout=120,
                                   cwd=Path(__file__).parents[2])
    said = done.stdout + done.stderr
    assert "OPENED" not in said, said
    assert "CouldNotRunError" in said and "network 'egress'" in said, said


# -- remote engines over ssh ------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["docker-remote", "podman-remote"])
async def test_egress_through_an_engine_reached_over_ssh(engine: str, upstreams: Upstreams) -> None:
    from toolseam.backends.docker import DockerBackend
    from toolseam.backends.podman import PodmanBackend

    variable = "TOOLSEAM_REMOTE_DOCKER_SSH_URL" if engine == "docker-remote" else \
        "TOOLSEAM_REMOTE_PODMAN_SSH_URL"
    ssh_url = required_env(variable, "the ssh endpoints")
    kind = DockerBackend if engine == "docker-remote" else PodmanBackend
    host_dir = shared_dir()
    made = kind(str(host_dir), image=remote_image(), endpoint=ssh_url,
                limits=SandboxLimits(network="egress"))
    try:
        async with Toolkit(made, settings=upstreams.settings()) as tk:
            ssh = Box(f"{engine} over ssh", tk, host_dir, "python3")
            await ssh.call("write", {"path": "egress_client.py", "content": CLIENT.read_text()})
            ok = await ssh.client("get", url=url("secure.test", upstreams.secure, "/private", "https"))
            assert ok["status"] == 200 and ok["body"] == "authorized\n", ok
            refused = await ssh.client("get", url=url("other.test", upstreams.web))
            assert refused["status"] == 403
            found = await ssh.client("probe", tcp_port=upstreams.tcp.port, udp_port=upstreams.udp.port,
                                     addresses=["169.254.169.254", *_host_addresses()])
            assert found["interfaces"] == ["lo"] and found["tcp"].startswith("ConnectionRefusedError")
            # no route out; the one nameserver is the agent's own on the sandbox's loopback
            assert found["nameservers"] == ["127.0.0.53"], found
            assert all(why != "ok" for where, why in found["routes"].items()
                       if not where.startswith("127.")), found
            scan = await ssh.client("scan", roots=["/"], secret_reversed_b64=base64.b64encode(
                upstreams.secret.encode()[::-1]).decode())
            assert scan["hits"] == []
            # the probe's lookup of a name no rule allows is refused by the resolver, and audited
            assert [(e.kind, e.host, e.status) for e in await ssh.settled(3)] == [
                ("connect", "secure.test", 200), ("http", "other.test", 403),
                ("dns", "pypi.org", 0)]
    finally:
        remove_shared(host_dir)
    assert upstreams.tcp.hits == [] and upstreams.udp.hits == []
