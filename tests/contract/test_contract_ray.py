"""The contract suite through the session's real 3-node Ray cluster (issue 39, item 7):
``RayBackend`` sessions placed on the rootless podman node, the docker head and the rootful
podman node (tests/support/ray_cluster.py), held to the same cases as every local backend
(the binding: tests/support/ray_contract.py).

The whole suite runs on the rootless node (the default engine of a Ray node); the docker node
runs every case but the file part's two grids, which it runs by one point each (decision 300:
the same agent code on every engine, and the Ray run's time). The podman node's run is the
remote backend over Ray's (test_contract_ray_remote.py, decision 457): the same cases, the
node's same engine, one class less in the Ray run's time.
"""

from __future__ import annotations

from ..support.ray_cluster import RAY_TESTS
from ..support.ray_contract import RayBinding, RaySubsetBinding

pytestmark = RAY_TESTS


class TestRayRootless(RayBinding):
    node = "rootless"


class TestRayDocker(RaySubsetBinding):
    node = "docker"

