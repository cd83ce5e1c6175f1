"""How long a session's sandbox lives, chosen once when the toolkit is made: ``Ephemeral`` (it
ends with its client — the default) or ``durable.Durable`` (it outlives its client for
``orphan_timeout_s``; docs/sessions.md). The toolkit calls the same five hooks on either; a new
lifetime is one class here and one line in ``lifetime_for``."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Protocol

from ..policy.settings import Settings
from ..seam.errors import ConfigurationError
from ..seam.handle import SessionHandle
from ..seam.protocol import BuiltinExec
from .durable import Durable

if TYPE_CHECKING:
    from .toolkit import Toolkit


class Lifetime(Protocol):
    adopted: bool  # the sandbox was there before this client (an attach): a failed open keeps it

    def before_open(self, backend: BuiltinExec) -> None: ...
    async def opened(self, tk: Toolkit) -> None: ...
    async def changed(self, tk: Toolkit) -> None: ...  # after a call, a turn, a pinned shell
    def handle(self, tk: Toolkit) -> SessionHandle: ...
    async def detach(self, tk: Toolkit) -> None: ...


class Ephemeral:
    """The sandbox ends with its client; nothing is kept anywhere."""

    adopted = False

    def before_open(self, backend: BuiltinExec) -> None:
        pass

    async def opened(self, tk: Toolkit) -> None:
        pass

    async def changed(self, tk: Toolkit) -> None:
        pass

    def handle(self, tk: Toolkit) -> SessionHandle:
        raise ConfigurationError("a session has a handle once it is open with the setting "
                                 "orphan_timeout_s above 0")

    async def detach(self, tk: Toolkit) -> None:
        raise ConfigurationError("detach needs the setting orphan_timeout_s above 0 (how "
                                 "long the sandbox waits for an attach); it is 0")


def lifetime_for(settings: Settings) -> Lifetime:
    if settings.orphan_timeout_s > 0:
        return Durable(secrets.token_urlsafe(32), settings.orphan_timeout_s)
    return Ephemeral()
