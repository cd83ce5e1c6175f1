"""Which node a new session goes to: one whose resources include those asked, spread over the
fitting nodes (fewest sessions this process has open there) or packed (the most) — and its node
actor. A session's transport gives its place back at close (``released``): counted over the
process's life instead, a driver that had run many sessions on one node spread every later
session over the others alone.

A node lost moments ago is still reported alive by Ray for several seconds (its health check),
so a driver that did not see it die may choose it; its actor then refuses connections
(``identity.ActorGone``), and ``reach`` places elsewhere rather than fail the session."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..seam.errors import CouldNotRunError
from . import cluster
from .actors import node_actor
from .identity import ActorGone

_placed: Counter[str] = Counter()  # this process's open sessions per node it chose
_lock = threading.Lock()


def released(node_id: str) -> None:
    """A session ``Placement.choose`` placed on ``node_id`` ended."""
    with _lock:
        if _placed[node_id] > 0:
            _placed[node_id] -= 1


@dataclass(frozen=True)
class Placement:
    resources: dict[str, float]
    strategy: str = "spread"
    node: str | None = None  # a node id: this node, or none (attach)
    # the node was chosen just now from the cluster's live nodes (a RayPool's claim): not
    # asked of the GCS again per session — a node lost since fails the session's first call
    fresh: bool = False

    def choose(self, ray: Any) -> str:
        if self.node is not None:
            if not self.fresh and not cluster.node_is_alive(ray, self.node):
                raise CouldNotRunError(f"Ray node {self.node[:12]} is not alive in the cluster",
                                       retryable=False)
            return self.node
        fit: list[str] = sorted(str(node["NodeID"]) for node in
                                cluster.fitting_nodes(ray, self.resources))
        with _lock:
            if self.strategy == "pack":
                chosen = max(fit, key=lambda n: (_placed[n], n))
            else:
                chosen = min(fit, key=lambda n: (_placed[n], n))
            _placed[chosen] += 1
        return chosen

    def reach(self, ray: Any) -> tuple[str, Any]:
        """The chosen node and its actor (blocking: call it off the event loop). A node whose
        actor is gone is placed on no more from this process, and another fitting node is
        chosen, unless this placement names its node."""
        gone: ActorGone | None = None
        while True:
            try:
                node_id = self.choose(ray)
            except CouldNotRunError:
                if gone is not None:  # the one that fitted was lost: say that, not "none fits"
                    raise gone from None
                raise
            try:
                return node_id, node_actor(ray, node_id)
            except ActorGone as exc:
                cluster.forget_actor(node_id, lost=True)
                if self.node is not None:
                    raise
                gone = exc
