"""Each workspace mode's durable variant (docs/sessions.md), by the mode's class: one row per
mode, as ``backend.MODES`` has one per name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ...seam.handle import SessionHandle
from .bind import BindMode
from .copy import CopyMode
from .durable_bind import DurableBindMode
from .durable_copy import DurableCopyMode
from .options import ContainerOptions
from .sandbox import ContainerSandbox, WorkspaceModeImpl


class DurableMode(WorkspaceModeImpl, Protocol):
    """What a workspace mode's durable variant adds: where its agent listens, how a client
    lets go, and what it keeps with the agent besides the toolkit's state."""

    @property
    def socket_path(self) -> str: ...
    async def detach(self, sandbox: ContainerSandbox) -> None: ...
    async def save_copy(self, sandbox: ContainerSandbox) -> None: ...


Make = Callable[[ContainerOptions, str, float, SessionHandle | None], DurableMode]
DURABLE_MODES: dict[type, Make] = {
    BindMode: lambda options, secret, timeout, adopt: DurableBindMode(
        secret, timeout, adopt, options.setid_files),
    CopyMode: lambda options, secret, timeout, adopt: DurableCopyMode(
        options.copy_bytes, options.copy_keep_group_write, secret, timeout, adopt,
        options.setid_files),
}


def durable_mode(mode: object, options: ContainerOptions, secret: str, orphan_timeout_s: float,
                 adopt: SessionHandle | None) -> DurableMode:
    """The durable variant of ``mode`` (a ``WorkspaceModeImpl``)."""
    return DURABLE_MODES[type(mode)](options, secret, orphan_timeout_s, adopt)
