"""A durable session through Ray (issue 47, decision 477): ``RemoteBackend`` over
``RayTransport`` with ``lifetime=Durable(...)`` on the rootful podman node. Its driver is
killed; once the node lets that driver's transport go (its lease), the node actor keeps the
session, and this process — another driver — attaches from the handle alone (which names the
node) and finds the files and the running job. A handle naming a node that is not there is
refused by that name."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from toolseam import AttachError, SessionHandle, Toolkit

from ..support.ray_cluster import RAY_TESTS, RayTestCluster, assert_node_empty, resource
from ..support.timing import patience

pytestmark = RAY_TESTS

DRIVER = """
import asyncio, json, sys
from toolseam import Toolkit
from toolseam.backends.remote import HostedSpec, RemoteBackend
from toolseam.ray.placement import Placement
from toolseam.ray.transport import RayTransport
from toolseam.seam.lifetime import Durable

async def main():
    address, res = sys.argv[1], json.loads(sys.argv[2])
    transport = RayTransport(Placement(res), address, orphan_timeout_s=2)  # a short lease
    tk = Toolkit(RemoteBackend(transport=transport, hosted=HostedSpec(kind="podman"),
                               lifetime=Durable(orphan_timeout_s=60)),
                 settings={"timeout_policy": "detach", "default_timeout_ms": 300})
    await tk.call("write", {"path": "before.txt", "content": "made before the kill"})
    await tk.call("bash", {"command": "sleep 2; echo finished", "keep": True})  # job 1
    print(tk.handle.to_json(), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def _killed_driver(ray_cluster: RayTestCluster) -> SessionHandle:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, ray_cluster.address,
                               json.dumps(resource("podman"))], stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert driver.stdout is not None
        return SessionHandle.from_json(driver.stdout.readline())
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        if driver.stdout is not None:
            driver.stdout.close()


async def _attached(handle: SessionHandle) -> Toolkit:
    """The attach, once the node has let the killed driver's transport go (its lease)."""
    deadline = time.monotonic() + patience(20)
    while True:
        try:
            return await Toolkit.attach(handle)
        except AttachError as busy:
            if busy.reason != "in_use" or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def test_a_killed_drivers_durable_session_is_attached_from_another_driver(
        ray_cluster: RayTestCluster) -> None:
    handle = _killed_driver(ray_cluster)
    node = ray_cluster.node_id("podman")
    assert handle.backend == "remote" and handle.endpoint == f"ray:{node}@{ray_cluster.address}"
    assert handle.hosted is not None and handle.hosted.backend == "podman"
    gone = "f" * len(node)  # a node the cluster never had, as a forged handle names it
    with pytest.raises(AttachError, match=f"Ray node {gone[:12]}") as refused:
        await Toolkit.attach(handle.model_copy(
            update={"endpoint": f"ray:{gone}@{ray_cluster.address}"}))
    assert refused.value.reason == "gone"
    with pytest.raises(AttachError) as wrong:
        await _attached(handle.model_copy(update={"secret": "x" * 43}))
    assert wrong.value.reason == "wrong_secret"
    tk = await _attached(handle)
    try:
        done = await tk.call("bash", {"wait": 1, "timeout": 20_000})
        assert done.output == "finished\n", done.output
        assert "made before the kill" in (await tk.call("read", {"path": "before.txt"})).output
    finally:
        await tk.close()
    await assert_node_empty(ray_cluster, "podman")
