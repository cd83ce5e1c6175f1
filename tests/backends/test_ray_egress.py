"""Egress mode for a session on a Ray node (``toolseam/ray/egress.py``, and the remote
backend's over Ray, ``backends/remote/egress.py``): the sandbox on the node
has loopback alone; its proxy clients reach the allowed host through this process's proxy (the
rules and the audit stay with the caller), a refused host is a 403 in the caller's log and the
model's text, a peer without the session's egress token gets nothing, and close leaves nothing.
The upstream is a real server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam import Toolkit
from toolseam.backends.remote import HostedSpec, RemoteBackend
from toolseam.policy.limits import SandboxLimits
from toolseam.ray import RayBackend
from toolseam.ray.placement import Placement
from toolseam.ray.transport import RayTransport
from toolseam.seam.models import SpawnRequest

from ..support.egress_servers import serve, static_handler
from ..support.ray_cluster import RAY_TESTS, RayTestCluster, assert_node_empty, resource
from ..support.ray_squatter import DRIVER, MARK, SQUATTER, as_user, record_dir, squatter_user

pytestmark = RAY_TESTS

FETCH = ("import sys, urllib.request, urllib.error\n"
         "try:\n"
         "    body = urllib.request.urlopen(sys.argv[1], timeout=30).read().decode()\n"
         "    print('200', body)\n"
         "except urllib.error.HTTPError as error:\n"
         "    print(error.code, error.read().decode()[:200])\n")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    root = tmp_path_factory.mktemp("upstream")
    (root / "hello.txt").write_text("hello from the upstream\n")
    with serve(static_handler(root)) as port:
        yield port


def egress_settings(upstream: int) -> dict[str, object]:
    """The toolkit's settings of these tests: web.test allowed, other.test not, both the
    upstream on 127.0.0.1."""
    return {"limits": {"network": "egress"}, "egress_allow": [f"web.test:{upstream}"],
            "egress_resolve": {"web.test": "127.0.0.1", "other.test": "127.0.0.1"},
            "egress_private": True}


@pytest.mark.parametrize("node", ["rootless", "docker"])
async def test_a_ray_session_in_egress_mode_reaches_only_the_allowed_host(
        ray_cluster: RayTestCluster, upstream: int, node: str) -> None:
    settings = egress_settings(upstream)
    backend = RayBackend(resources=resource(node), address=ray_cluster.address,
                         limits=SandboxLimits(network="egress"))
    async with Toolkit(backend, settings=settings) as tk:
        assert (await tk.call("write", {"path": "fetch.py", "content": FETCH})).is_error is False
        allowed = await tk.call("bash", {"command": f"python3 fetch.py http://web.test:{upstream}/hello.txt"})
        assert allowed.output.startswith("200 hello from the upstream"), allowed.output
        refused = await tk.call("bash", {"command": f"python3 fetch.py http://other.test:{upstream}/"})
        assert refused.output.startswith("403"), refused.output
        # the model reads why, with the setting that would allow it
        assert any(note.startswith("[egress: refused other.test") and "egress_allow" in note
                   for note in refused.model_hints.notes), refused.model_hints.notes
        log = tk.egress_log()
        assert [(e.host, e.allowed, e.status) for e in log] == [
            ("web.test", True, 200), ("other.test", False, 403)]
        assert log[0].job is not None  # attributed here, though it was opened on the node
        # no way around the proxy: the sandbox on the node has loopback alone
        direct = await tk.call("bash", {"command": (
            "python3 -c \"import socket; s=socket.socket(); s.settimeout(3); "
            f"print(s.connect_ex(('127.0.0.1', {upstream})))\"")})
        assert direct.output.strip() != "0", direct.output
        # a peer of the cluster that finds the caller's port but lacks the token gets nothing
        host, port = backend._egress_at  # the port a peer of the cluster could find
        before = len(tk.egress_log())
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(json.dumps({"t": "0" * 64}).encode() + b"\n"
                     + f"GET http://web.test:{upstream}/hello.txt HTTP/1.1\r\n\r\n".encode())
        await writer.drain()
        try:
            answered = await asyncio.wait_for(reader.read(), 10)
        except ConnectionResetError:  # cut (an abort), not answered
            answered = b""
        assert answered == b""
        writer.close()
        end = backend._egress
        assert end is not None and end.refused == 1
        assert len(tk.egress_log()) == before  # the proxy never saw it
    assert end is not None and end._server is None  # the caller's listener closed with it
    await assert_node_empty(ray_cluster, node)



async def test_a_local_user_on_a_crashed_drivers_port_gets_nothing_and_reaches_no_one(
        ray_cluster: RayTestCluster, upstream: int) -> None:
    """A driver in egress mode is killed; its session lives on (its handle attached here);
    another local user binds the port the driver freed. The node's relay proves nothing to it
    and it proves nothing back: it receives no token and no request, and its answer never
    reaches the sandbox's client (issue 44, decision 337)."""
    user = squatter_user()
    records = record_dir(user)
    record = os.path.join(records, "received")
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, ray_cluster.address,
                               json.dumps(resource("rootless")), str(upstream), FETCH],
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert driver.stdout is not None
        handle, port, token = json.loads(await asyncio.to_thread(driver.stdout.readline))
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        if driver.stdout is not None:
            driver.stdout.close()
    squatter = subprocess.Popen(as_user(user, ["/usr/bin/python3", "-c", SQUATTER, str(port),
                                               record]),
                                stdout=subprocess.PIPE)
    backend = RayBackend.attach(handle, address=ray_cluster.address)
    try:
        assert squatter.stdout is not None
        assert (await asyncio.to_thread(squatter.stdout.readline)) == b"listening\n"
        await backend.open()
        fetched = await backend.start(SpawnRequest(
            job="fetch", argv=["sh", "-c", f". ./proxy.sh; python3 fetch.py "
                                           f"http://web.test:{upstream}/hello.txt 2>&1"],
            cwd="/workspace", env={"PATH": "/usr/local/bin:/usr/bin:/bin"}, deadline_ms=60_000))
        assert MARK.decode() not in fetched.output, fetched.output
        assert "hello from the upstream" not in fetched.output
        received = Path(record).read_bytes() if os.path.exists(record) else b""
        assert token.encode() not in received
        assert b"web.test" not in received and b"GET" not in received
        assert received == b"" or received.startswith(b'{"n":')  # a nonce, nothing else
    finally:
        squatter.kill()
        squatter.wait()
        if squatter.stdout is not None:
            squatter.stdout.close()
        await backend.close()
        shutil.rmtree(records, ignore_errors=True)
    await assert_node_empty(ray_cluster, "rootless")


async def test_a_remote_session_in_egress_mode_reaches_only_the_allowed_host(
        ray_cluster: RayTestCluster, upstream: int) -> None:
    """The sandbox's connections come to this process's proxy as events of one long stream
    (``backends/remote/egress.py``): delivered while the session lives, they reach the
    allowed host and are refused another, in this process's log."""
    settings = egress_settings(upstream)
    backend = RemoteBackend(transport=RayTransport(Placement(resource("docker")),
                                                   ray_cluster.address),
                            hosted=HostedSpec(kind="docker",
                                              options={"limits": {"network": "egress"}}))
    async with Toolkit(backend, settings=settings) as tk:
        assert (await tk.call("write", {"path": "fetch.py", "content": FETCH})).is_error is False
        allowed = await asyncio.wait_for(tk.call("bash", {
            "command": f"python3 fetch.py http://web.test:{upstream}/hello.txt"}), 60)
        assert allowed.output.startswith("200 hello from the upstream"), allowed.output
        refused = await tk.call("bash", {
            "command": f"python3 fetch.py http://other.test:{upstream}/"})
        assert refused.output.startswith("403"), refused.output
        assert [(e.host, e.allowed, e.status) for e in tk.egress_log()] == [
            ("web.test", True, 200), ("other.test", False, 403)]
        # no way around the proxy: the sandbox on the node has loopback alone
        direct = await tk.call("bash", {"command": (
            "python3 -c \"import socket; s=socket.socket(); s.settimeout(3); "
            f"print(s.connect_ex(('127.0.0.1', {upstream})))\"")})
        assert direct.output.strip() != "0", direct.output
    await assert_node_empty(ray_cluster, "docker")
