"""The contract suite through the session's real 3-node Ray cluster (issue 39, item 7):
``RayBackend`` sessions placed on the rootless podman node, the docker head and the rootful
podman node (tests/support/ray_cluster.py), held to the same cases as every local backend
(the binding: tests/support/ray_contract.py).

The whole suite runs on the rootless node (the default engine of a Ray node); the docker and
podman nodes run every case but the file part's two grids, which they run by one point each
(decision 300: the same agent code on every engine, and the Ray run's time); the rows of a
read-only table share a sandbox, as on the engines (``support/shared_cases.py``, decision
406). ``RayBackend`` is the remote backend over Ray (decision 497), so these are also its
contract runs.
"""

from __future__ import annotations

from ..support.ray_cluster import RAY_TESTS
from ..support.ray_contract import RayBinding, RaySubsetBinding
from ..support.shared_cases import SharedParameterSandbox

pytestmark = RAY_TESTS


class TestRayRootless(SharedParameterSandbox, RayBinding):
    node = "rootless"


class TestRayDocker(SharedParameterSandbox, RaySubsetBinding):
    node = "docker"


class TestRayPodman(SharedParameterSandbox, RaySubsetBinding):
    """The rootful podman node, by the same subset: ``RayBackend`` is the remote client of the
    node's own engine over ``RayTransport`` (decision 497), so this is also the remote
    backend's contract run through Ray (decision 457, formerly test_contract_ray_remote.py)."""

    node = "podman"

