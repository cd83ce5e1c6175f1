"""``toolseam.SandboxPool``: the container wing's warm pool (``backends/containers/pool/warm.py``)
with the one thing that needs the session layer — a ``Toolkit`` on a handed-out sandbox. Kept
here so the backends never import the session (the import contract, ``.importlinter``)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..backends.containers.pool.warm import ContainerPool
from ..observability.hook import pool_claim
from ..policy.limits import SandboxLimits
from ..policy.settings import Settings, parse_settings
from ..seam.errors import ConfigurationError
from .toolkit import Toolkit, open_toolkit

__all__ = ["SandboxPool"]


class SandboxPool(ContainerPool):
    __doc__ = ContainerPool.__doc__

    async def toolkit(self, base_dir: str | os.PathLike[str], *,
                      settings: Settings | Mapping[str, Any] | None = None,
                      **toolkit_kwargs: Any) -> Toolkit:
        """An open ``Toolkit`` on a warm sandbox with ``base_dir`` as its workspace (at
        ``/workspace`` inside); ``toolkit_kwargs`` are the Toolkit's other parameters
        (``tools``, ``env_extra``, ``on_output`` …). ``settings.limits``, when set, must be the
        pool's: a sandbox's limits are fixed when it starts."""
        for taken in ("backend", "backend_options"):
            if taken in toolkit_kwargs:
                raise ConfigurationError(f"pool.toolkit: {taken} is the pool's")
        if settings is not None and not isinstance(settings, Settings):
            settings = parse_settings(dict(settings))
        if settings is not None and not settings.limits.is_default and \
                settings.limits != (self.limits or SandboxLimits()):
            raise ConfigurationError(
                "settings.limits differ from the pool's: a pooled sandbox's limits are fixed "
                "when it starts; give them to the pool (SandboxPool(..., limits=...))")
        with pool_claim(self.pool_id, self.ready_count):
            backend = await self.backend(base_dir)
        return await open_toolkit(backend, settings=settings, **toolkit_kwargs)

