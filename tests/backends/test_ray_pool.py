"""``RayPool``: a warm pool over the session's 3-node Ray cluster (issue 39, part 3)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from toolseam.ray import RayPool

from ..support.ray_cluster import NODES, RAY_TESTS, RayTestCluster, assert_node_empty

pytestmark = RAY_TESTS


async def test_claims_at_once_spread_over_every_nodes_warm_sandboxes(
        ray_cluster: RayTestCluster, workspace: Path) -> None:
    bases = []
    for i in range(6):
        base = workspace / f"w{i}"
        base.mkdir()
        (base / "in.txt").write_text(f"task {i}\n")
        bases.append(base)
    async with RayPool(size=6, address=ray_cluster.address) as pool:
        await pool.wait_full()
        toolkits = await asyncio.gather(*(pool.toolkit(base) for base in bases))
        assert sorted(pool.claims().values()) == [2, 2, 2]  # one CPU each: an equal share
        assert {tk.backend.transport.node_id for tk in toolkits} == {
            ray_cluster.node_id(n) for n in NODES}
        answers = await asyncio.gather(*(
            tk.call("bash", {"command": "cat in.txt; echo out > out.txt"}) for tk in toolkits))
        assert [a.output for a in answers] == [f"task {i}\n" for i in range(6)]
        await asyncio.gather(*(tk.close() for tk in toolkits))
        assert all((base / "out.txt").read_text() == "out\n" for base in bases)
    for node in NODES:  # the warm ones the refill made are gone with the pool
        await assert_node_empty(ray_cluster, node)
