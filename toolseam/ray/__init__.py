"""toolseam sandboxes across a Ray cluster (the ``ray`` extra): docs/ray.md.

``RayBackend`` places one sandbox on a node of the cluster: the remote backend over
``RayTransport``, the node's own engine running it (``TOOLSEAM_RAY_BACKEND`` in the node's
environment).
``create(...)`` is Ray's own sandbox shape (``ray.experimental.sandbox.create``) on those
engines. Ray is imported only when a session opens, so this module imports without it.
"""

from __future__ import annotations

from .backend import RayBackend
from .node_config import NodeConfig
from .pool import RayPool
from .shaped import RaySandbox, create
from .shaped_types import (
    ExecResult,
    ExecutionResult,
    SandboxCreationError,
    SandboxError,
    SandboxExecError,
    SandboxNotFoundError,
    SandboxStatus,
    SandboxTimeoutError,
)

__all__ = ["ExecResult", "ExecutionResult", "NodeConfig", "RayBackend", "RayPool", "RaySandbox",
           "SandboxCreationError", "SandboxError", "SandboxExecError", "SandboxNotFoundError",
           "SandboxStatus", "SandboxTimeoutError", "create"]
