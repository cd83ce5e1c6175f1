"""Each workspace mode's durable variant (docs/sessions.md), by the mode's name: one row per
mode, as ``backend.MODES`` has one per name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ....seam.errors import ConfigurationError
from ....seam.handle import SessionHandle
from ..options import ContainerOptions
from ..sandbox import ContainerSandbox, WorkspaceModeImpl
from .durable_bind import DurableBindMode
from .durable_copy import DurableCopyMode


class DurableMode(WorkspaceModeImpl, Protocol):
    """What a workspace mode's durable variant adds: where its agent listens, how a client
    lets go, and what it keeps with the agent besides the toolkit's state."""

    @property
    def socket_path(self) -> str: ...
    async def detach(self, sandbox: ContainerSandbox) -> None: ...
    async def save_copy(self, sandbox: ContainerSandbox) -> None: ...


Make = Callable[[ContainerOptions, str, float, SessionHandle | None], DurableMode]
DURABLE_MODES: dict[str, Make] = {
    "bind": lambda options, secret, timeout, adopt: DurableBindMode(
        secret, timeout, adopt, options.setid_files),
    "copy": lambda options, secret, timeout, adopt: DurableCopyMode(
        options.copy_bytes, options.copy_keep_group_write, secret, timeout, adopt,
        options.setid_files),
}


def durable_mode(mode: WorkspaceModeImpl, options: ContainerOptions, secret: str,
                 orphan_timeout_s: float, adopt: SessionHandle | None) -> DurableMode:
    """The durable variant of ``mode``; a mode without one cannot keep a session past its
    client (a new mode needs no durable variant to work: it is one module and one row in
    ``backend.MODES``; this table's row makes it durable too)."""
    make = DURABLE_MODES.get(mode.name)
    if make is None:
        raise ConfigurationError(f"orphan_timeout_s: the {mode.name} workspace mode cannot keep "
                                 "a session past its client")
    return make(options, secret, orphan_timeout_s, adopt)
