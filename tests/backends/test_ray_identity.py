"""A node actor is who it says it is (toolseam/ray/identity.py, decision 336): another job of
the cluster that registers a node actor's name first — the plain ``toolseam-node-<id>`` the
old code adopted, or the keyed name itself, read from the cluster's list of named actors — is
never sent a session's id, secret or workspace, and nothing it answers is read; an actor
another driver of this cluster key made is adopted once it proved the key."""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
from typing import Any

import pytest

from toolseam.ray import RayBackend
from toolseam.ray import cluster as ray_cluster_module
from toolseam.ray.identity import kv_key
from toolseam.seam.errors import CouldNotRunError
from toolseam.seam.models import SpawnRequest

from ..support.ray_cluster import RAY_TESTS, RayTestCluster, resource

pytestmark = RAY_TESTS


def impostor_class(ray: Any) -> Any:
    """Another job's actor: records every call, and plants a KV entry pointing at a port of
    its own that answers the identity question with a made-up proof."""

    @ray.remote(num_cpus=0)
    class Impostor:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def _record(self, name: str) -> Any:
            self.calls.append(name)
            return ("ok", {"where": "PWNED", "direct": None})

        # what toolseam calls of a node actor, each recorded (the open carries the secret)
        def ready(self, *args: Any) -> Any:
            return {"where": "PWNED", "direct": None, "calls": self._record("ready")}

        def bind_key(self, *args: Any) -> Any:
            return self._record("bind_key")

        def open(self, *args: Any) -> Any:
            return self._record("open")

        def call_packed(self, *args: Any) -> Any:
            return self._record("call_packed")

        async def plant(self, kv_key: str) -> None:
            from ray.experimental import internal_kv

            async def answer(reader: asyncio.StreamReader,
                             writer: asyncio.StreamWriter) -> None:
                await reader.read(100)
                body = b"0" * 64 + b"\0" + b"1" * 64
                writer.write(len(body).to_bytes(4, "big") + body)
                await writer.drain()
                writer.close()
            self.server = await asyncio.start_server(answer, "127.0.0.1", 0)
            port = self.server.sockets[0].getsockname()[1]
            internal_kv._internal_kv_put(kv_key, f"127.0.0.1:{port}", namespace="toolseam")

        def received(self) -> list[str]:
            return list(self.calls)

    return Impostor


async def test_an_actor_registered_first_by_another_job_gets_nothing(
        ray_cluster: RayTestCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    node = ray_cluster.node_id("podman")
    ray_cluster_module.connect(ray_cluster.address)
    # a driver whose cluster key another job does not have, but whose node actor's name it
    # read from the list of named actors before the driver first used the node
    monkeypatch.setattr(ray_cluster_module, "_cluster_key", secrets.token_bytes(32))
    ray_cluster_module.forget_actor(node)
    impostor = impostor_class(ray)
    planted = []
    for name in (ray_cluster_module.ACTOR_PREFIX + node, ray_cluster_module.actor_name(node)):
        try:
            ray.get_actor(name, namespace="toolseam")
            continue  # the plain name is taken already (a genuine actor of an older run)
        except ValueError:
            pass
        made = impostor.options(name=name, namespace="toolseam").remote()
        await made.plant.remote(kv_key(made._actor_id.hex()))
        planted.append(made)
    assert len(planted) >= 1
    try:
        backend = RayBackend(resources=resource("podman"), address=ray_cluster.address)
        with pytest.raises(CouldNotRunError) as refused:
            await backend.open()
        assert "is not toolseam's node actor" in refused.value.reason
        assert "did not prove" in refused.value.reason
        await backend.close()
        for made in planted:
            assert await made.received.remote() == []  # no open, no id, no secret
    finally:
        for made in planted:
            ray.kill(made)
        ray_cluster_module.forget_actor(node)


async def test_an_actor_another_driver_made_is_adopted_once_it_proved_the_key(
        ray_cluster: RayTestCluster) -> None:
    """This process forgets the actor it made (as another driver of the same key would not
    know it): found by name, it proves the key on its direct port and serves the session."""
    node = ray_cluster.node_id("rootless")
    first = RayBackend(resources=resource("rootless"), address=ray_cluster.address)
    await first.open()
    await first.close()
    ray_cluster_module.forget_actor(node)
    again = RayBackend(resources=resource("rootless"), address=ray_cluster.address)
    try:
        await again.open()
        status = await again.start(_request())
        assert status.exit_code == 0
        assert again.direct_connected  # made at the first call after the open
    finally:
        await again.close()


def _request() -> SpawnRequest:
    return SpawnRequest(job="j1", argv=["true"], cwd="/workspace", env={})


def test_a_driver_without_token_authentication_is_warned_what_that_means(
        ray_cluster: RayTestCluster) -> None:
    """The test cluster has no token: a driver that connects says, once, that any process
    reaching the GCS — every local user, even on loopback — can run code on its nodes."""
    script = ("import sys\nfrom toolseam.ray import cluster\ncluster.connect(sys.argv[1])\n")
    env = {name: value for name, value in os.environ.items() if name != "RAY_AUTH_MODE"}
    done = subprocess.run([sys.executable, "-c", script, ray_cluster.address], env={
        **env, "PYTHONPATH": os.getcwd()}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "without token authentication" in done.stderr
    assert "every local user, even on 127.0.0.1" in done.stderr
