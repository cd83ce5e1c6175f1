"""The contract suite through the session's real 3-node Ray cluster (issue 39, item 7):
``RayBackend`` sessions placed on the docker head, the rootful podman node and the rootless
podman node (tests/support/ray_cluster.py), held to the same cases as every local backend.

From the caller's side a Ray session is copy mode (the workspace goes there as a tar and
comes back at sync/close), so the cases that arrange files in the host dir *during* the
session are listed as for a remote engine (``CopyModeBinding``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from toolseam.ray import RayBackend
from toolseam.seam.protocol import BuiltinExec

from ..support.contract_bindings import CopyModeBinding
from ..support.ray_cluster import RAY_TESTS, RayTestCluster, resource

pytestmark = RAY_TESTS


class _RayBinding(CopyModeBinding):
    node = ""  # a node of the test cluster (ray_cluster.NODES)
    address = ""

    @pytest.fixture(autouse=True)
    def _cluster(self, ray_cluster: RayTestCluster) -> None:
        self.address = ray_cluster.address

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        return RayBackend(str(host_dir), resources=resource(self.node),
                          address=self.address), "/workspace"


class TestRayDocker(_RayBinding):
    node = "docker"


class TestRayPodman(_RayBinding):
    node = "podman"


class TestRayRootless(_RayBinding):
    node = "rootless"
