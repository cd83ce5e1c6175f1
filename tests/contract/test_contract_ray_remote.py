"""The contract suite through the remote backend over Ray (issue 47, item 2): a session of
``RemoteBackend(transport=RayTransport(...))`` on the rootful podman node of the session's
Ray cluster, in the shape ``RayBackend`` asks for — the node's own engine (``placed``,
decision 493) and the caller's directory copied there and home by the copy-back rule
(decision 491) — held to the cases ``RayBackend`` meets on the docker node (the file part's
two grids by one point each), every operation crossing as a row of the one table, with no
Ray-specific forwarder. It is the podman node's contract run (decision 457): ``RayBackend``'s
own forwarders run the suite on the rootless and docker nodes (test_contract_ray.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolseam.backends.remote import HostedSpec, RemoteBackend
from toolseam.ray.placement import Placement
from toolseam.ray.transport import RayTransport
from toolseam.seam.protocol import BuiltinExec

from ..support.ray_cluster import RAY_TESTS, resource
from ..support.ray_contract import RaySubsetBinding

pytestmark = RAY_TESTS


class TestRayRemotePodman(RaySubsetBinding):
    node = "podman"

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        made = RemoteBackend(transport=RayTransport(Placement(resource(self.node)),
                                                    self.address),
                             hosted=HostedSpec(kind="placed"), workspace=str(host_dir))
        return made, "/workspace"  # type: ignore[return-value]

    @staticmethod
    def capability_probe() -> Any:
        return RemoteBackend(transport=RayTransport(Placement({})),
                             hosted=HostedSpec(kind="placed"))
