"""Each workspace mode's durable variant (docs/sessions.md), by the mode's class: one row per
mode, as ``backend.MODES`` has one per name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...handle import SessionHandle
from .bind import BindMode
from .copy import CopyMode
from .durable_bind import DurableBindMode
from .durable_copy import DurableCopyMode
from .options import ContainerOptions

Make = Callable[[ContainerOptions, str, float, SessionHandle | None], Any]
DURABLE_MODES: dict[type, Make] = {
    BindMode: lambda options, secret, timeout, adopt: DurableBindMode(secret, timeout, adopt),
    CopyMode: lambda options, secret, timeout, adopt: DurableCopyMode(
        options.copy_bytes, options.copy_keep_group_write, secret, timeout, adopt),
}


def durable_mode(mode: object, options: ContainerOptions, secret: str, orphan_timeout_s: float,
                 adopt: SessionHandle | None) -> Any:
    """The durable variant of ``mode`` (a ``WorkspaceModeImpl``)."""
    return DURABLE_MODES[type(mode)](options, secret, orphan_timeout_s, adopt)
