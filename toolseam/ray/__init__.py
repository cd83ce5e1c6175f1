"""toolseam sandboxes across a Ray cluster (the ``ray`` extra): docs/ray.md.

``RayBackend`` places one sandbox on a node of the cluster: the remote backend over
``RayTransport``, the node's own engine running it (``TOOLSEAM_RAY_BACKEND`` in the node's
environment).
``RayPool`` keeps warm sandboxes on every node. Ray's own sandbox shape
(``ray.experimental.sandbox.create``) is ``toolseam.integrations.ray_sandbox``, over these.
Ray is imported only when a session opens, so this module imports without it.
"""

from __future__ import annotations

from .backend import RayBackend
from .node_config import NodeConfig
from .pool import RayPool

__all__ = ["NodeConfig", "RayBackend", "RayPool"]
