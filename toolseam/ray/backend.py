"""``RayBackend``: a sandbox on a node of a Ray cluster, run by that node's own engine — the
remote backend (``backends/remote/``) over ``RayTransport``, with the node's engine as its
hosted kind (``placed``, decision 493) and the caller's workspace copied there and home
(decision 491). Placement picks the node at open; the node actor's ``RemoteServer`` hosts the
session; calls go on the node's direct port after the open (``transport.py``).

It inherits what the remote client does: durable sessions and ``Toolkit.attach``
(``lifetime=Durable(...)``, decision 477), branching (a snapshot in this user's store opens
on any node), live output, egress through this process's proxy, traces, ``kill_sandbox``.
"""

from __future__ import annotations

from typing import Any, Literal

from ..backends.remote import HostedSpec
from ..backends.remote.client import expected_capabilities, remote_class
from ..backends.remote.spec import PLACED
from ..policy.limits import SandboxLimits
from ..seam.errors import ConfigurationError
from ..seam.lifetime import EPHEMERAL, BackendLifetime
from .node_remote import DEFAULT_ORPHAN_TIMEOUT_S
from .placement import Placement
from .transport import RayTransport

_PlacedClient: Any = remote_class(expected_capabilities(PLACED))


class RayBackend(_PlacedClient):  # type: ignore[misc]
    """``RayBackend(workspace, image=…, resources={…}, strategy="spread", address=…)``: one
    sandbox on a node of a Ray cluster, run by that node's own engine."""

    name = "ray"

    def __new__(cls, *args: Any, **kwargs: Any) -> RayBackend:
        made: RayBackend = object.__new__(cls)
        return made

    def __init__(self, workspace: str | None = None, *, image: str | None = None,
                 resources: dict[str, float] | None = None,
                 strategy: Literal["spread", "pack"] = "spread", address: str | None = None,
                 node: str | None = None, limits: SandboxLimits | None = None,
                 orphan_timeout_s: float = DEFAULT_ORPHAN_TIMEOUT_S,
                 copy_limit: int | None = None, direct: bool = True,
                 lifetime: BackendLifetime = EPHEMERAL) -> None:
        """``orphan_timeout_s``: how long the node keeps this session after the last word from
        this process (a killed driver's); ``lifetime=Durable(...)``: a session that outlives
        its driver, attached to by ``Toolkit.attach(handle)`` (its files stay on the node:
        no ``workspace`` copy)."""
        if strategy not in ("spread", "pack"):
            raise ConfigurationError(f"strategy must be 'spread' or 'pack', got {strategy!r}")
        if orphan_timeout_s <= 0:
            raise ConfigurationError(f"orphan_timeout_s must be positive, got {orphan_timeout_s}")
        options: dict[str, Any] = {}
        if image:
            options["image"] = image
        if limits is not None:
            options["limits"] = limits.model_dump(mode="json")
        super().__init__(
            transport=RayTransport(Placement(dict(resources or {}), strategy, node), address,
                                   direct, orphan_timeout_s),
            hosted=HostedSpec(kind=PLACED, options=options), workspace=workspace,
            copy_limit=copy_limit, lifetime=lifetime)
        self.image, self.limits, self.orphan_timeout_s = image, limits, orphan_timeout_s
        self.network = limits.network if limits is not None else "none"

    @property
    def node_id(self) -> str | None:
        """The node the session was placed on (None before open)."""
        return self.transport.node_id  # type: ignore[no-any-return]

    @property
    def where(self) -> str:
        return str(self.transport.where)

    @property
    def direct_connected(self) -> bool:
        """Tool calls go on the node's direct port now (not through Ray)."""
        return bool(self.transport.direct_connected)
