"""``toolseam ps`` through Ray (issue 49): a session whose sandbox lives on a Ray node is listed
from the driver's machine with its node and the usage its node's engine measures, and
``toolseam ps --kill`` ends that sandbox on its node — the owner's call in the middle of
``sleep 30`` fails as ``sandbox_lost`` at once, and its close leaves nothing on the node."""

from __future__ import annotations

import asyncio
import json

from toolseam import CouldNotRunError, Toolkit
from toolseam.ray import RayBackend

from ..support.cli import run
from ..support.ray_cluster import RAY_TESTS, RayTestCluster, assert_node_empty, resource

pytestmark = RAY_TESTS
NODE = "docker"  # cgroups v1: docker's engine measures a container's CPU and memory


async def started(tk: Toolkit) -> bool:
    done = await tk.call("bash", {"command": "test -e started && echo yes"})
    return done.output == "yes\n"


async def test_ps_lists_a_ray_session_and_kill_ends_its_sandbox_on_the_node(
        ray_cluster: RayTestCluster) -> None:
    backend = RayBackend(resources=resource(NODE), address=ray_cluster.address)
    tk = Toolkit(backend, raise_could_not_run=True)
    try:
        await tk.open()
        running = asyncio.ensure_future(tk.call("bash", {"command": ": > started; sleep 30"}))
        async with asyncio.timeout(30):
            while not await started(tk):
                await asyncio.sleep(0.1)
        # ps is another process: this loop stays free to answer it (the row's usage)
        listed = await asyncio.to_thread(run, "ps", "--json")
        assert listed.returncode == 0, listed.stderr
        row = {r["id"]: r for r in json.loads(listed.stdout)}[tk.session_id]
        assert row["backend"] == "ray" and row["node"] == ray_cluster.node_id(NODE)
        assert row["cpu_seconds"] is not None and row["memory_bytes"]
        killed = await asyncio.to_thread(run, "ps", "--kill", tk.session_id)
        assert killed.returncode == 0, killed.stderr
        try:
            async with asyncio.timeout(20):  # not the 30 s the command would take
                await running
            raise AssertionError("the command ran to its end")
        except CouldNotRunError as exc:
            assert exc.cause == "sandbox_lost", exc.reason
        try:
            await tk.call("bash", {"command": "true"})
            raise AssertionError("a call after the kill ran")
        except CouldNotRunError as exc:
            assert exc.cause == "sandbox_lost", exc.reason
    finally:
        # the sandbox is gone: its copy-back cannot be made, and close says so
        await asyncio.gather(tk.close(), return_exceptions=True)
    await assert_node_empty(ray_cluster, NODE)
