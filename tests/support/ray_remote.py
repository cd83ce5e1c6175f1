"""The remote backend over Ray as the Ray tests make it: a session on the node a placement
chooses, hosted by the node's own engine (``kind="placed"``, decision 493) — what
``RayBackend`` asks for — so a test runs the same case through both clients."""

from __future__ import annotations

from typing import Any

from toolseam.backends.remote import HostedSpec, RemoteBackend
from toolseam.ray.placement import Placement
from toolseam.ray.transport import RayTransport


def placed(resources: dict[str, float], address: str, *, direct: bool = True,
           **options: Any) -> RemoteBackend:
    """A remote session on a node whose resources include ``resources``."""
    return RemoteBackend(transport=RayTransport(Placement(dict(resources)), address,
                                                direct=direct),
                         hosted=HostedSpec(kind="placed", options=options))
