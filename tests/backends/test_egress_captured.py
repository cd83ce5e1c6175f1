"""Captured connections, TCP by name, placeholder credentials and attribution (issue 36), from
inside real sandboxes: the host backend, podman rootful and rootless, docker.

Every client here ignores the proxy variables (they are unset, or the program never reads
them): a python3 raw socket, a static busybox ``nc`` and ``wget``, ``redis-cli``, ``git`` over
``ssh`` (the host backend: the images have python3 alone). Each upstream is a real server on the
host's 127.0.0.1 (``tests/support/tcp_upstreams.py``, ``egress_servers.py``), its name pinned
with ``egress_resolve``.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from toolseam import Toolkit, ToolResult
from toolseam.egress import EgressEvent
from toolseam.policy.limits import SandboxLimits

from ..support.egress_servers import Seen, UpstreamCA, make_bare_repo, make_test_ca, web_server
from ..support.engines import backend, remove_shared, shared_dir
from ..support.tcp_upstreams import Sshd, echo_server, redis, sshd
from ..support.timing import patience

pytestmark = pytest.mark.asyncio(loop_scope="module")

BACKENDS = ("host", "podman", "podman-rootless", "docker")
CLIENT = Path(__file__).parent.parent / "support" / "captured_client.py"
BUSYBOX = "/usr/bin/busybox"  # Debian's busybox-static: runs in any image
NAMES = ("echo.test", "cache.test", "ssh.test", "gh.test", "web.test", "elsewhere.test")
TOKEN_ENV = "EGRESS_GH_REAL_TOKEN"  # in the toolseam process only
NO_PROXY_ENV = ("env -u HTTP_PROXY -u HTTPS_PROXY -u http_proxy -u https_proxy "
                "-u NO_PROXY -u no_proxy")


@dataclass
class Upstreams:
    ca: UpstreamCA
    echo: int
    redis: int
    ssh: Sshd
    gh: int
    gh_seen: Seen
    web: int
    web_seen: Seen
    token: str

    def settings(self) -> dict[str, Any]:
        return {"limits": {"network": "egress"},
                "egress_allow": [f"echo.test:{self.echo}", f"cache.test:{self.redis}",
                                 f"ssh.test:{self.ssh.port}", f"gh.test:{self.gh}",
                                 f"web.test:{self.web}", f"elsewhere.test:{self.web}"],
                "egress_resolve": dict.fromkeys(NAMES, "127.0.0.1"), "egress_private": True,
                "egress_ca_file": str(self.ca.ca_file),
                "egress_credentials": [{"host": "gh.test", "header": "Authorization",
                                        "value_env": TOKEN_ENV, "placeholder_env": "GITHUB_TOKEN"}]}


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstreams]:
    root = tmp_path_factory.mktemp("captured")
    ca = make_test_ca(root / "ca", ["gh.test"])
    token = "ghp_" + uuid.uuid4().hex + uuid.uuid4().hex[:4]  # GitHub's shape: ghp_ + 36
    repo = make_bare_repo(root / "git")
    gh_seen, web_seen = Seen(), Seen()
    with pytest.MonkeyPatch.context() as patch, ExitStack() as stack:
        patch.setenv(TOKEN_ENV, token)
        yield Upstreams(
            ca=ca, echo=stack.enter_context(echo_server()),
            redis=stack.enter_context(redis(root / "redis")),
            ssh=stack.enter_context(sshd(root / "ssh", repo)),
            gh=stack.enter_context(web_server(gh_seen, tls=ca, secret_header="Authorization",
                                              secret=f"token {token}")),
            gh_seen=gh_seen, web=stack.enter_context(web_server(web_seen)), web_seen=web_seen,
            token=token)


@dataclass
class Box:
    name: str
    tk: Toolkit = field(repr=False)
    host_dir: Path = field(repr=False)
    results: list[ToolResult] = field(default_factory=list, repr=False)
    last_call: str = ""

    @property
    def python(self) -> str:
        return sys.executable if self.name == "host" else "python3"

    async def bash(self, command: str, check: bool = True) -> str:
        self.last_call = f"call-{uuid.uuid4().hex[:8]}"
        result = await self.tk.call("bash", {"command": command, "timeout": 60_000},
                                    call_id=self.last_call)
        self.results.append(result)
        assert not check or not result.is_error, (self.name, command[:200], result.output)
        return result.output

    async def client(self, command: str, **args: Any) -> Any:
        out = await self.bash(f"{NO_PROXY_ENV} {self.python} captured_client.py {command} "
                              f"{shlex.quote(json.dumps(args))}")
        return json.loads(out.strip().splitlines()[-1])

    async def settled(self, count: int,
                      until: Callable[[list[EgressEvent]], bool] | None = None) -> list[EgressEvent]:
        """The audit once it holds ``count`` events (and ``until`` holds of it, when given): an
        event is written when its connection ends, which under load comes seconds later."""
        deadline = time.monotonic() + patience(30)
        while time.monotonic() < deadline:
            log = self.tk.egress_log()
            if len(log) >= count and (until is None or until(log)):
                break
            await asyncio.sleep(0.05)
        return self.tk.egress_log()


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=BACKENDS)
async def box(request: pytest.FixtureRequest, upstreams: Upstreams) -> AsyncIterator[Box]:
    host_dir = shared_dir()
    shutil.copy(CLIENT, host_dir / "captured_client.py")
    shutil.copy(BUSYBOX, host_dir / "busybox")
    key = host_dir / "id_test"
    shutil.copy(upstreams.ssh.key, key)
    key.chmod(0o600)
    name = request.param
    tk = (Toolkit("host", base_dir=host_dir, settings=upstreams.settings()) if name == "host" else
          Toolkit(backend(name, str(host_dir), limits=SandboxLimits(network="egress")),
                  settings=upstreams.settings()))
    try:
        await tk.open()
        yield Box(name, tk, host_dir)
    finally:
        await tk.close()
        remove_shared(host_dir)


# -- any program reaches an allowed name, and nothing else -----------------------------------
async def test_a_raw_socket_reaches_an_allowed_name_and_is_attributed(box: Box,
                                                                      upstreams: Upstreams) -> None:
    before = len(box.tk.egress_log())
    answer = await box.client("tcp", host="echo.test", port=upstreams.echo, send="hello")
    assert answer == {"ok": True, "got": "echo:hello"}, answer
    [event] = [e for e in (await box.settled(before + 1))[before:] if e.kind == "tcp"]
    assert (event.host, event.port, event.allowed, event.address) == (
        "echo.test", upstreams.echo, True, "127.0.0.1")
    assert (event.bytes_up, event.bytes_down) == (5, 10)
    # who opened it: the process, its job, and the call that started that job
    assert event.pid is not None and event.pid > 1
    assert event.argv[0].endswith(("python3", Path(sys.executable).name)), event.argv
    assert event.argv[1] == "captured_client.py"
    assert event.job is not None and event.call == box.last_call


async def test_names_and_ports_not_allowed_go_nowhere_and_are_audited(box: Box,
                                                                       upstreams: Upstreams) -> None:
    before = len(box.tk.egress_log())
    resolved = await box.bash("getent hosts echo.test; getent hosts refused.test; echo rc=$?")
    assert re.match(r"127\.100\.\d+\.\d+\s+echo\.test\n", resolved), resolved
    assert resolved.rstrip().endswith("rc=2"), resolved  # refused.test: no such name
    refused = await box.client("tcp", host="refused.test", port=upstreams.echo, send="x")
    assert not refused["ok"] and "gaierror" in refused["error"], refused
    other_port = await box.client("tcp", host="echo.test", port=upstreams.echo + 1, send="x")
    assert not other_port["ok"] and "ConnectionRefused" in other_port["error"], other_port
    events = (await box.settled(before + 1))[before:]
    dns = [e for e in events if e.kind == "dns"]
    assert [(e.host, e.allowed) for e in dns] == [("refused.test", False)]  # audited once
    assert "not in egress_allow" in dns[0].reason
    assert 'egress_allow = ["refused.test"]' in dns[0].reason
    assert not [e for e in events if e.kind == "tcp"]  # nothing was connected


async def test_static_busybox_nc_and_wget_ignore_the_proxy_and_still_get_through(
        box: Box, upstreams: Upstreams) -> None:
    nc = await box.bash(f"printf 'PING\\r\\n' | {NO_PROXY_ENV} ./busybox nc cache.test "
                        f"{upstreams.redis}")
    assert nc.strip() == "+PONG", nc
    page = await box.bash(f"{NO_PROXY_ENV} ./busybox wget -q -O- "
                          f"http://web.test:{upstreams.web}/direct")
    assert json.loads(page)["path"] == "/direct"


async def test_a_redis_client_by_name(box: Box, upstreams: Upstreams) -> None:
    if box.name == "host":  # the real redis-cli; in the images, redis's protocol by hand
        out = await box.bash(f"{NO_PROXY_ENV} redis-cli -h cache.test -p {upstreams.redis} "
                             "SET greeting hello && redis-cli -h cache.test "
                             f"-p {upstreams.redis} GET greeting")
        assert out.split() == ["OK", "hello"], out
    else:
        answer = await box.client("tcp", host="cache.test", port=upstreams.redis,
                                  send="*1\r\n$4\r\nPING\r\n")
        assert answer == {"ok": True, "got": "+PONG\r\n"}, answer


async def test_git_clone_over_ssh(box: Box, upstreams: Upstreams) -> None:
    if box.name != "host":
        pytest.skip("the test image has no ssh or git (python3 alone); the host backend runs "
                    "the real ones")
    ssh = ("ssh -i id_test -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
           "-o BatchMode=yes -o LogLevel=ERROR")
    out = await box.bash(f"{NO_PROXY_ENV} GIT_SSH_COMMAND={shlex.quote(ssh)} git clone -q "
                         f"ssh://root@ssh.test:{upstreams.ssh.port}{upstreams.ssh.repo} cloned "
                         "&& cat cloned/README")
    assert out.strip().endswith("hello egress"), out


# -- placeholder credentials ------------------------------------------------------------------
async def test_a_placeholder_of_the_tokens_shape_is_swapped_for_the_bound_host_only(
        box: Box, upstreams: Upstreams) -> None:
    placeholder = (await box.bash("printf %s \"$GITHUB_TOKEN\"")).strip()
    token = upstreams.token
    assert placeholder != token and placeholder.startswith("ghp_") and len(placeholder) == len(token)
    assert re.fullmatch(r"ghp_[0-9a-z]+", placeholder), placeholder  # the same classes
    header = {"Authorization": f"token {placeholder}"}
    # straight to the host, no proxy variable: captured, TLS terminated with the session CA
    direct = await box.client("https", host="gh.test", port=upstreams.gh, path="/private",
                              headers=header)
    assert direct == {"status": 200, "body": "authorized\n"}, direct
    before = len(box.tk.egress_log())
    # the placeholder sent anywhere else: refused before a byte goes there, and audited
    seen = len(upstreams.web_seen.paths)
    leaked = await box.bash(
        f"{box.python} -c \"import urllib.request as u, os; r = u.Request("
        f"'http://elsewhere.test:{upstreams.web}/x', headers={{'X-Token': os.environ['GITHUB_TOKEN']}})\n"
        "try:\n    u.urlopen(r)\nexcept Exception as e: print(e)\"")
    assert "403" in leaked, leaked
    raw = await box.client("tcp", host="web.test", port=upstreams.web,
                           send=f"GET /?t={placeholder} HTTP/1.0\r\nHost: web.test\r\n\r\n")
    assert raw["ok"] and raw["got"] == "", raw  # captured plain TCP: cut, nothing answered
    assert len(upstreams.web_seen.paths) == seen
    def refused(log: list[EgressEvent]) -> set[str]:
        return {e.host for e in log[before:] if not e.allowed}

    # both refusals, not "two more events": the direct call's own event may land after `before`
    events = (await box.settled(before + 2, lambda log: len(refused(log)) >= 2))[before:]
    refusals = [e for e in events if not e.allowed]
    assert {e.host for e in refusals} == {"elsewhere.test", "web.test"}
    assert all("placeholder" in e.reason and e.status == 403 for e in refusals), refusals


async def test_the_real_token_is_nowhere_inside(box: Box, upstreams: Upstreams) -> None:
    roots = [str(box.host_dir)] if box.name == "host" else None
    found = await box.client("scan", needle_hex=upstreams.token.encode().hex(), roots=roots)
    assert found["found"] == [], found
    assert found["regions_read"] > 0  # the memory of some process was read indeed
    assert all(upstreams.token not in r.output for r in box.results)


async def test_placeholder_and_token_never_reach_the_log(box: Box, upstreams: Upstreams) -> None:
    text = json.dumps([e.__dict__ for e in box.tk.egress_log()], default=str)
    assert upstreams.token not in text

