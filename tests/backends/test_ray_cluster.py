"""toolseam through a real 3-node Ray cluster (issue 39): every node runs its own engine.

The session's cluster (tests/support/ray_cluster.py): a docker head, a rootful podman node and
a rootless podman node, all on 127.0.0.1. A Toolkit over ``RayBackend`` must answer exactly as
the same backend opened here, listings included; the workspace goes there as a tar and comes
back by the copy-back rule; close leaves nothing on the node.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from toolseam import Toolkit
from toolseam.ray import RayBackend
from toolseam.seam.errors import CouldNotRunError

from ..support.engines import backend as local_backend
from ..support.engines import remote_image, required_env
from ..support.ray_cluster import (
    NODES,
    RAY_TESTS,
    REMOTE_NODE,
    RayTestCluster,
    assert_node_empty,
    resource,
)

pytestmark = RAY_TESTS

# (tool, arguments): the builtins over a tree with more entries than a listing shows
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("bash", {"command": "cat a.txt; ls sub | head -3; sleep 0.1; echo to-stderr >&2; exit 3"}),
    ("read", {"path": "a.txt"}),
    ("read", {"path": "sub"}),
    ("read", {"path": "missing.txt"}),
    ("write", {"path": "new/n.txt", "content": "fresh\n"}),
    ("edit", {"path": "a.txt", "oldString": "needle two", "newString": "NEEDLE 2"}),
    ("apply_patch", {"patchText": "*** Begin Patch\n*** Add File: p.txt\n+patched\n"
                                  "*** End Patch"}),
    ("grep", {"pattern": "needle|NEEDLE"}),
    ("grep", {"pattern": "x", "include": "*.py"}),
    ("glob", {"pattern": "**/*.py"}),
    ("glob", {"pattern": "*.txt"}),
    ("bash", {"command": "rm sub/f007.py; printf 'done\\n'"}),
]


def make_tree(root: Path) -> None:
    (root / "a.txt").write_text("needle one\nneedle two\nhay\n")
    (root / "sub").mkdir()
    for i in range(150):  # past the listings' caps
        (root / "sub" / f"f{i:03}.py").write_text(f"x = {i}\n")


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


async def run_calls(tk: Toolkit) -> list[tuple[bool, str]]:
    return [((r := await tk.call(name, args)).is_error, r.output) for name, args in CALLS]


@pytest.mark.parametrize("node", sorted(NODES))
async def test_builtins_through_a_node_answer_as_the_same_backend_here(
        ray_cluster: RayTestCluster, node: str, workspace: Path) -> None:
    engine = NODES[node][0]
    here, there = workspace / "here", workspace / "there"
    for root in (here, there):
        root.mkdir()
        root.chmod(0o777)
        make_tree(root)
    async with Toolkit(local_backend(engine, str(here), workspace_mode="copy")) as tk:
        expected = await run_calls(tk)
    ray_backend = RayBackend(str(there), resources=resource(node), address=ray_cluster.address)
    async with Toolkit(ray_backend) as tk:
        assert ray_backend.node_id == ray_cluster.node_id(node)
        assert f"node {node} " in ray_backend.where
        got = await run_calls(tk)
    for (name, args), want, have in zip(CALLS, expected, got, strict=True):
        assert have == want, (node, name, args)
    assert expected[0] == (True, expected[0][1]) and "to-stderr" in expected[0][1]
    # the copy-back brought the sandbox's changes home, as the local copy mode did
    assert tree(there) == tree(here)
    assert (there / "new" / "n.txt").read_text() == "fresh\n"
    assert not (there / "sub" / "f007.py").exists()
    await assert_node_empty(ray_cluster, node)


async def test_a_node_whose_engine_is_on_another_machine(ray_cluster: RayTestCluster,
                                                        workspace: Path) -> None:
    """A node configured with a remote engine's URL (the suite's remote podman, over tcp)
    joins the cluster: its sessions run on that engine, answer as the same remote engine opened
    here, come back by the copy-back rule, and close leaves nothing there."""
    [(name, (engine, variable))] = REMOTE_NODE.items()
    ray_cluster.add_node(name, engine, required_env(variable, "remote engines"),
                         image=remote_image())
    try:
        ray_cluster.cluster.wait_for_nodes()
        here, there = workspace / "here", workspace / "there"
        for root in (here, there):
            root.mkdir()
            root.chmod(0o777)
            make_tree(root)
        async with Toolkit(local_backend("podman-remote", str(here))) as tk:
            expected = await run_calls(tk)
        ray_backend = RayBackend(str(there), resources=resource(name),
                                 address=ray_cluster.address)
        async with Toolkit(ray_backend) as tk:
            assert ray_backend.node_id == ray_cluster.node_id(name)
            assert required_env(variable, "remote engines") in ray_backend.where
            got = await run_calls(tk)
        assert got == expected
        assert tree(there) == tree(here)
        await assert_node_empty(ray_cluster, name)
    finally:
        await ray_cluster.remove_node(name)  # gone before a later test's spread counts nodes


async def test_an_image_only_session_needs_no_workspace_and_close_ends_it(
        ray_cluster: RayTestCluster) -> None:
    ray_backend = RayBackend(resources=resource("rootless"), address=ray_cluster.address)
    async with Toolkit(ray_backend) as tk:
        result = await tk.call("bash", {"command": "pwd; ls -A | wc -l"})
        assert result.output == "/workspace\n0\n"
    with pytest.raises(Exception, match="closed"):
        await ray_backend.stat(ray_backend_ref())
    await assert_node_empty(ray_cluster, "rootless")


def ray_backend_ref() -> Any:
    from toolseam.seam.models import PathRef
    return PathRef(base="/", path="/workspace", confine=False)


async def test_sessions_spread_over_the_nodes(ray_cluster: RayTestCluster) -> None:
    made = [RayBackend(strategy="spread", address=ray_cluster.address) for _ in range(6)]
    await asyncio.gather(*(b.open() for b in made))
    try:
        placed = {b.node_id for b in made}
        assert placed == {ray_cluster.node_id(n) for n in NODES}
        answers = await asyncio.gather(*(Toolkit(b).call("bash", {"command": "echo up"})
                                         for b in made))
        assert [a.output for a in answers] == ["up\n"] * 6
    finally:
        await asyncio.gather(*(b.close() for b in made))


async def test_a_placement_no_node_offers_is_refused_at_once(ray_cluster: RayTestCluster
                                                             ) -> None:
    began = time.monotonic()
    asked: dict[str, float] = {"GPU": 1, "toolseam-docker": 1}
    with pytest.raises(CouldNotRunError) as caught:
        await RayBackend(resources=asked, address=ray_cluster.address).open()
    assert time.monotonic() - began < 10
    assert "GPU=1" in caught.value.reason and "toolseam-docker=1" in caught.value.reason
    assert "toolseam-podman=1000" in caught.value.reason  # what the nodes offer
    assert caught.value.retryable is False
