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
        assert row["image"] and row["image"] == tk.info.image  # SandboxInfo's (decision 487)
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


async def test_ps_ray_lists_the_clusters_sessions_and_ends_one(
        ray_cluster: RayTestCluster) -> None:
    """``toolseam ps --ray ADDRESS`` asks the cluster's node actors, not this machine's
    processes: the session is listed by its node with its calls and usage, and ``--kill``
    ends its sandbox there (the driver's next call is ``sandbox_lost``) — a remote session's
    too (``RemoteServer.rows``, ``kill_from_outside``: decision 494)."""
    backend = RayBackend(resources=resource(NODE), address=ray_cluster.address)
    tk = Toolkit(backend, raise_could_not_run=True)
    try:
        await tk.open()
        await tk.call("bash", {"command": "echo one"})
        listed = await asyncio.to_thread(run, "ps", "--ray", ray_cluster.address, "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {r["id"]: r for r in json.loads(listed.stdout)}
        row = rows[backend.session_id]
        assert row["backend"] == "ray" and row["node"] == ray_cluster.node_id(NODE)
        assert row["calls"] >= 1 and row["cpu_seconds"] is not None and row["memory_bytes"]
        assert row["image"] and row["image"] == tk.info.image  # what its open said it runs
        assert row["owner_pid"] is None  # the driver may be on any machine
        assert backend._secret not in listed.stdout  # no session's secret is ever shown
        unknown = await asyncio.to_thread(run, "ps", "--ray", ray_cluster.address, "--kill",
                                          "no-such-session")
        assert unknown.returncode == 2 and "no live session 'no-such-session'" in unknown.stderr
        killed = await asyncio.to_thread(run, "ps", "--ray", ray_cluster.address, "--kill",
                                         backend.session_id)
        assert killed.returncode == 0, killed.stderr
        try:
            await tk.call("bash", {"command": "true"})
            raise AssertionError("a call after the kill ran")
        except CouldNotRunError as exc:
            assert exc.cause == "sandbox_lost", exc.reason
    finally:
        await asyncio.gather(tk.close(), return_exceptions=True)
    await assert_node_empty(ray_cluster, NODE)


async def test_a_node_actor_answers_no_operator_request_without_the_proof(
        ray_cluster: RayTestCluster) -> None:
    """Another job finds a node actor by its name (Ray lists named actors) and calls it: with
    no proof, a proof under another key, or a nonce played a second time, it lists nothing
    and ends nothing."""
    import ray

    from toolseam.ray import cluster, identity

    backend = RayBackend(resources=resource(NODE), address=ray_cluster.address)
    tk = Toolkit(backend, raise_could_not_run=True)
    try:
        await tk.open()
        node_id = ray_cluster.node_id(NODE)
        actor = ray.get_actor(cluster.actor_name(node_id), namespace=cluster.NAMESPACE)
        right = identity.node_key(cluster.cluster_key(), node_id)

        def ask(method: str, key: bytes, what: str, *args: object,
                nonce: str | None = None) -> tuple[object, ...]:
            asked = nonce or str(ray.get(actor.operator_nonce.remote()))
            proof = identity.operator_proof(key, asked, what)
            return tuple(ray.get(getattr(actor, method).remote(*args, asked, proof)))

        wrong = bytes(32)
        assert ask("operator_sessions", wrong, "list")[0] == "err"
        assert ask("operator_kill", wrong, f"kill {backend.session_id}", backend.session_id
                   )[0] == "err"
        # a proof for "list" does not kill
        assert ask("operator_kill", right, "list", backend.session_id)[0] == "err"
        nonce = str(ray.get(actor.operator_nonce.remote()))
        first = ask("operator_sessions", right, "list", nonce=nonce)
        assert first[0] == "ok" and backend.session_id in {r["id"] for r in first[1]}
        assert ask("operator_sessions", right, "list", nonce=nonce)[0] == "err"  # replayed
        assert ask("operator_sessions", right, "list", nonce="made-up")[0] == "err"
        assert (await tk.call("bash", {"command": "echo alive"})).output == "alive\n"
    finally:
        await tk.close()
    await assert_node_empty(ray_cluster, NODE)
