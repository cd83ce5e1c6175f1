"""How long a backend's sandbox lives: an option of the backend, chosen when it is built and
never changed after (docs/sessions.md, decision 453).

``Ephemeral`` (the default) ends the sandbox with its client. ``Durable`` keeps it past its
client for ``orphan_timeout_s``, waiting for an attach that proves ``secret`` — or, with
``adopt``, builds the backend to attach to the running session a handle names. A backend that
keeps sessions (``capabilities.DurableSessions``) takes either as ``lifetime=``; ``Toolkit``
passes the one its settings choose when it builds a backend by name::

    HostBackend(workspace, lifetime=Durable(orphan_timeout_s=900))
    PodmanBackend(workspace, image=..., lifetime=Durable(orphan_timeout_s=900))
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from .errors import ConfigurationError
from .handle import SessionHandle


@dataclass(frozen=True)
class Ephemeral:
    """The sandbox ends with its client: closed, crashed or killed."""


@dataclass(frozen=True, kw_only=True)
class Durable:
    """The sandbox outlives its client for ``orphan_timeout_s`` seconds. ``secret`` is the
    right to attach (a fresh one by default; never shown by ``repr``); ``adopt``: the handle of
    the running session this backend attaches to instead of starting one."""

    orphan_timeout_s: float = 0.0
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)
    adopt: SessionHandle | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.adopt is None and not self.orphan_timeout_s > 0:
            raise ConfigurationError(f"lifetime=Durable(orphan_timeout_s={self.orphan_timeout_s!r})"
                                     ": how long the sandbox waits for an attach must be above 0")
        if len(self.secret) < 16:
            raise ConfigurationError("lifetime=Durable(secret=...): a session's secret is the "
                                     "right to attach; at least 16 characters")

    @classmethod
    def attaching(cls, handle: SessionHandle) -> Durable:
        """The lifetime of a backend built to attach to the session ``handle`` names."""
        return cls(secret=handle.secret, adopt=handle)


EPHEMERAL = Ephemeral()
BackendLifetime = Ephemeral | Durable

__all__ = ["EPHEMERAL", "BackendLifetime", "Durable", "Ephemeral"]
