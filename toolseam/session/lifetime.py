"""How long a session's sandbox lives, chosen once when the toolkit is made: ``Ephemeral`` (it
ends with its client — the default) or ``durable.Durable`` (it outlives its client for
``orphan_timeout_s``; docs/sessions.md). The toolkit calls the same five hooks on either, and
builds a backend by name with its ``backend_lifetime`` (``seam/lifetime.py``); a backend the
caller built brings its own lifetime, which the session's then follows. A new lifetime is one
class here and one line in ``lifetime_for``."""

from __future__ import annotations

import secrets
from typing import Protocol

from ..policy.settings import Settings
from ..seam.capabilities import DurableSessions, lifetime_of, supports
from ..seam.errors import ConfigurationError
from ..seam.handle import SessionHandle
from ..seam.lifetime import EPHEMERAL, BackendLifetime
from ..seam.lifetime import Durable as DurableOption
from ..seam.protocol import BuiltinExec
from .durable import Durable
from .toolkit_view import ToolkitView


class Lifetime(Protocol):
    adopted: bool  # the sandbox was there before this client (an attach): a failed open keeps it
    orphan_timeout_s: float  # how long the sandbox waits for an attach (0: it does not)

    @property
    def backend_lifetime(self) -> BackendLifetime: ...  # a backend built by name gets it

    def before_open(self, backend: BuiltinExec) -> None: ...
    async def opened(self, tk: ToolkitView) -> None: ...
    async def changed(self, tk: ToolkitView) -> None: ...  # after a call, a turn, a pinned shell
    def handle(self, tk: ToolkitView) -> SessionHandle: ...
    async def detach(self, tk: ToolkitView) -> None: ...


class Ephemeral:
    """The sandbox ends with its client; nothing is kept anywhere."""

    adopted = False
    orphan_timeout_s = 0.0
    backend_lifetime: BackendLifetime = EPHEMERAL

    def before_open(self, backend: BuiltinExec) -> None:
        pass

    async def opened(self, tk: ToolkitView) -> None:
        pass

    async def changed(self, tk: ToolkitView) -> None:
        pass

    def handle(self, tk: ToolkitView) -> SessionHandle:
        raise ConfigurationError("a session has a handle once it is open with the setting "
                                 "orphan_timeout_s above 0")

    async def detach(self, tk: ToolkitView) -> None:
        raise ConfigurationError("detach needs the setting orphan_timeout_s above 0 (how "
                                 "long the sandbox waits for an attach); it is 0")


def lifetime_for(settings: Settings, built: BuiltinExec | None = None) -> Lifetime:
    """From the settings; for a backend the caller ``built``, from the lifetime it was built
    with — which the settings cannot change (``ConfigurationError`` naming both)."""
    wanted = settings.orphan_timeout_s
    if built is not None:
        chosen = lifetime_of(built)
        if isinstance(chosen, DurableOption):
            if wanted not in (0, chosen.orphan_timeout_s):
                raise ConfigurationError(
                    f"orphan_timeout_s: the settings say {wanted:g}, but the backend was built "
                    f"with lifetime=Durable(orphan_timeout_s={chosen.orphan_timeout_s:g}); a "
                    "backend's lifetime is chosen when it is built")
            return Durable(chosen.secret, chosen.orphan_timeout_s)
        if wanted > 0 and supports(built, DurableSessions):  # one that keeps none: at open
            raise ConfigurationError(
                f"orphan_timeout_s: this {getattr(built, 'name', 'backend')} backend was built "
                "to end with its client, and a backend's lifetime is chosen when it is built, "
                "never switched after: build it with lifetime=Durable(orphan_timeout_s="
                f"{wanted:g}) (toolseam.seam.lifetime), or give the Toolkit the backend's name")
    if wanted > 0:
        return Durable(secrets.token_urlsafe(32), wanted)
    return Ephemeral()
