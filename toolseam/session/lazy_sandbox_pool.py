"""``toolseam.SandboxPool``, imported on first use — a loader, not a pool (issue 47 renamed
``session/pool.py``): the pool lives in the container wing (``backends/containers/pool/warm.py``,
with ``sandbox_pool.py`` on top), which needs a container extra (``requests`` and an engine
SDK), while ``import toolseam`` must work on a bare install."""

from __future__ import annotations

from typing import Any

from .._extras import install_hint
from ..seam.errors import BackendUnavailable


def __getattr__(name: str) -> Any:
    """The package's lazy names (PEP 562): ``toolseam/__init__.py`` imports this function."""
    if name != "SandboxPool":
        raise AttributeError(f"module 'toolseam' has no attribute {name!r}")
    try:
        from .sandbox_pool import SandboxPool
    except ModuleNotFoundError as exc:
        raise BackendUnavailable(f"SandboxPool needs the {exc.name!r} package: "
                                 f"{install_hint('podman')} (or the docker extra)") from None
    return SandboxPool
