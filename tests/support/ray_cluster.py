"""A real multi-node Ray cluster on this machine for the tests (tests/backends/test_ray_*.py).

One per test session (the ``ray_cluster`` fixture of conftest.py; scripts/test runs the tests
marked ``ray`` in a pytest of their own, one process): a head and two more nodes, each a
raylet of its own with its own engine, named by its own environment (``TOOLSEAM_RAY_BACKEND``)
as a machine of a real cluster would be. Everything binds 127.0.0.1; no dashboard; one CPU per node.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

from .timing import patience

# node name -> (engine, the variable naming its endpoint); each node also offers a resource
# named after it (``toolseam-<name>``) so a test can place a session on it
NODES = {"docker": ("docker", "TOOLSEAM_DOCKER_URL"),
         "podman": ("podman", "TOOLSEAM_PODMAN_URL"),
         "rootless": ("podman-rootless", "TOOLSEAM_PODMAN_ROOTLESS_URL")}
HEAD = "docker"
# a node that joins for one test (test_ray_cluster.py): its engine is on "another machine" —
# the remote podman the suite reaches over tcp — and it pulls the image from the registry
REMOTE_NODE = {"remote": ("podman", "TOOLSEAM_REMOTE_PODMAN_URL")}
# every Ray test module's pytestmark. scripts/test runs them in a pytest of their own, in one
# process (one cluster); the xdist group says the same to `--dist loadgroup` where xdist
# still honours it (under pytest 9.2 and xdist 3.8 it does not: each worker would start one)
RAY_TESTS = [pytest.mark.ray, pytest.mark.xdist_group("ray-cluster")]


def node_env(engine: str, name: str, endpoint: str | None = None,
             workdir: str | None = None, image: str | None = None) -> dict[str, str]:
    """The environment a node's processes get: its engine, its name, where it keeps things."""
    options: dict[str, Any] = {}
    if engine != "host":
        options = {"image": image or os.environ.get("TOOLSEAM_IMAGE",
                                                    "localhost/toolseam-sandbox:latest")}
        if endpoint:
            options["endpoint"] = endpoint
    env = {"TOOLSEAM_RAY_BACKEND": engine, "TOOLSEAM_RAY_NODE_NAME": name,
           "TOOLSEAM_RAY_BACKEND_OPTIONS": json.dumps(options)}
    if workdir:
        env["TOOLSEAM_RAY_WORKDIR"] = workdir
    return env


def resource(name: str) -> dict[str, float]:
    return {f"toolseam-{name}": 1}


@dataclass
class RayTestCluster:
    cluster: Any
    address: str
    nodes: dict[str, Any] = field(default_factory=dict)  # name -> ray's Node
    killed: set[str] = field(default_factory=set)  # node ids Ray may still report alive

    def node_id(self, name: str) -> str:
        return str(self.nodes[name].node_id)

    def add_node(self, name: str, engine: str, endpoint: str | None = None,
                 image: str | None = None, env: dict[str, str] | None = None,
                 **extra: Any) -> Any:
        """Another node (a machine joining); ``remove_node`` kills it like a lost machine.
        ``env``: more of its environment (its own OpenTelemetry configuration, say)."""
        node = self.cluster.add_node(
            node_ip_address="127.0.0.1", num_cpus=1, include_dashboard=False,
            resources={f"toolseam-{name}": 1000, **extra.pop("resources", {})},
            env_vars={**node_env(engine, name, endpoint, image=image), **(env or {})}, **extra)
        self.nodes[name] = node
        return node

    async def wait_dead(self, node_id: str, timeout_s: float = 60.0) -> None:
        """Until Ray's own health check has declared the node dead (other drivers, which did
        not see it die, would otherwise still place work there)."""
        import asyncio

        import ray
        deadline = time.monotonic() + timeout_s
        while any(n["NodeID"] == node_id and n["Alive"]
                  for n in ray.nodes()):  # type: ignore[no-untyped-call]
            assert time.monotonic() < deadline, f"Ray still reports node {node_id} alive"
            await asyncio.sleep(1.0)

    def kill_node(self, name: str) -> None:
        """The node's raylet and every process of it killed at once (no goodbye). Ray's
        health check declares it dead only seconds later: the ``ray_cluster`` fixture waits
        for that after the test (``settle``)."""
        node = self.nodes.pop(name)
        self.killed.add(str(node.node_id))
        self.cluster.remove_node(node, allow_graceful=False)

    async def remove_node(self, name: str) -> None:
        """The node stopped as an operator stops a machine (its raylet told to go, so it
        leaves the cluster at once) and gone from ``ray.nodes()``: for a node a test added for
        its own use. ``kill_node`` is for a test about a lost node: Ray's health check takes
        about 15 s to declare a killed one dead."""
        import asyncio

        node = self.nodes.pop(name)
        await asyncio.to_thread(self.cluster.remove_node, node, True)
        await self.wait_dead(str(node.node_id))

    def settle(self, timeout_s: float = 60.0) -> None:
        """Until Ray has declared every node killed so far dead (blocking: a fixture's end)."""
        import ray
        deadline = time.monotonic() + patience(timeout_s)
        while self.killed:
            alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}  # type: ignore[no-untyped-call]
            self.killed &= alive
            if self.killed:
                assert time.monotonic() < deadline, f"Ray still reports {self.killed} alive"
                time.sleep(0.5)


@contextmanager
def started() -> Iterator[RayTestCluster]:
    from ray.cluster_utils import Cluster

    endpoints = {name: os.environ.get(var) for name, (_, var) in NODES.items()}
    engine, _ = NODES[HEAD]
    began = time.monotonic()
    cluster = Cluster(initialize_head=True, shutdown_at_exit=True, head_node_args=dict(
        node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=1,
        resources={f"toolseam-{HEAD}": 1000},
        env_vars=node_env(engine, HEAD, endpoints[HEAD])))
    made = RayTestCluster(cluster, cluster.gcs_address, {HEAD: cluster.head_node})
    try:
        for name, (engine, _) in NODES.items():
            if name != HEAD:
                made.add_node(name, engine, endpoints[name])
        made.cluster.wait_for_nodes()
        print(f"ray test cluster: {len(made.nodes)} nodes in {time.monotonic() - began:.1f} s")
        yield made
    finally:
        import ray
        ray.shutdown()  # the driver first: the head cannot go while a driver is connected
        cluster.shutdown()  # type: ignore[no-untyped-call]


async def assert_node_empty(ray_cluster: RayTestCluster, node: str) -> None:
    """The node actor holds no session and its engine no container of that actor."""
    import ray

    from toolseam.backends.containers.labels import OWNER_LABEL
    from toolseam.ray import actors
    actor = actors.node_actor(ray, ray_cluster.node_id(node))
    stats = await actor.stats.remote()
    ready = await actor.ready.remote()
    # a remote session a driver's close has ended is gone at once; one an earlier test's
    # dead driver left ends when its transport's lease runs out: wait for that, not longer
    deadline = time.monotonic() + patience(15)
    while stats["remote_sessions"]:
        assert time.monotonic() < deadline, f"{stats['remote_sessions']} remote session(s) left"
        await asyncio.sleep(0.2)
        stats = await actor.stats.remote()
    engine, variable = {**NODES, **REMOTE_NODE}[node]
    url = os.environ[variable]
    made: Any
    if engine == "docker":
        from toolseam.backends.docker import docker_engine
        made = docker_engine(url)
    else:
        from toolseam.backends.podman import podman_engine
        made = podman_engine(url, engine == "podman-rootless")
    owner = f":{ready['pid']}:"
    left = [name for name, labels in made.labeled(OWNER_LABEL)
            if owner in labels.get(OWNER_LABEL, "")]
    assert left == []
