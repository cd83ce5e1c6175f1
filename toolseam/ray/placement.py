"""Which node a new session goes to: one whose resources include those asked, spread over the
fitting nodes (fewest sessions this process placed) or packed (the most)."""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from ..seam.errors import CouldNotRunError
from . import cluster

_placed: Counter[str] = Counter()
_lock = threading.Lock()


@dataclass(frozen=True)
class Placement:
    resources: dict[str, float]
    strategy: str = "spread"
    node: str | None = None  # a node id: this node, or none (attach)

    def choose(self, ray: Any) -> str:
        if self.node is not None:
            if not cluster.node_is_alive(ray, self.node):
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
