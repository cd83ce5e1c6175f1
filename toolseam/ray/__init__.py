"""toolseam sandboxes across a Ray cluster (the ``ray`` extra): docs/ray.md.

``RayBackend`` places one sandbox on a node of the cluster and forwards the seam to it; the
node's own engine runs it (``TOOLSEAM_RAY_BACKEND`` in the node's environment). Ray is
imported only when a session opens, so this module imports without it.
"""

from __future__ import annotations

from .backend import RayBackend
from .node_config import NodeConfig

__all__ = ["NodeConfig", "RayBackend"]
