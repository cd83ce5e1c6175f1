"""Optional capabilities of a backend, beside the protocol every backend has
(``protocol.py``): a front end asks the backend for one and gets a clear "not supported" where
it is missing, never a test of the backend's class or name (inspect_ai's sandbox environments
and anyio's backends do the same).

* ``DurableSessions`` — a sandbox that outlives its client (docs/sessions.md): the host backend
  and the container backends, in both workspace modes.
* ``EngineShell`` — the engine's own command line for a shell in the sandbox (inspect_ai's
  ``connection()``): the container backends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .errors import ConfigurationError
from .handle import SessionHandle


@runtime_checkable
class DurableSessions(Protocol):
    """What ``toolseam.session.durable`` needs of a backend to keep a session past its client."""

    def make_durable(self, secret: str, orphan_timeout_s: float,
                     adopt: SessionHandle | None = None) -> None:
        """Before ``open``: start a durable agent (or, with ``adopt``, attach to the one the
        handle names) instead of an ordinary one.

        Raises:
            ConfigurationError: the backend is open already (a pooled sandbox, say).
        """

    def durable_handle(self, session_id: str, secret: str) -> SessionHandle:
        """Where the open sandbox is, for another process to attach."""

    async def detach(self) -> None:
        """End this client's part; the sandbox and its jobs go on."""

    async def keep_state(self, part: str, state: Any, text: str | None = None) -> None:
        """Keep ``state`` with the sandbox's agent (sealed: ``agentlink/durable.py``);
        ``text``: its canonical JSON, when the caller has it already."""

    def kept_state(self, part: str) -> Any:
        """What the last attach found kept as ``part`` (None if nothing), its seal checked.

        Raises:
            AttachError: ``tampered`` — something in the sandbox changed it.
        """

    def attached_jobs(self) -> list[dict[str, Any]]:
        """The jobs the agent reported at the last attach (``job``, ``argv``, ``pid``,
        ``started``, ``state``)."""

    async def keep_backend_state(self) -> None:
        """Keep what the backend itself needs after a client's death (copy mode's baseline)."""


@dataclass(frozen=True)
class ShellAccess:
    container: str  # the engine's id of the sandbox's container
    command: str  # ``podman --url … exec -it … bash -l``


@runtime_checkable
class EngineShell(Protocol):
    """A sandbox an engine runs, reachable by the engine's own command line."""

    def shell_access(self, user: str | None = None) -> ShellAccess | None:
        """How to open a login shell in the open sandbox (None before open)."""


_durable_types: dict[type, bool] = {}  # a Protocol isinstance costs ~16 µs; a class's answer is fixed


def durable_sessions(backend: object) -> DurableSessions:
    """``backend`` as a ``DurableSessions``; a ``ConfigurationError`` naming the setting when
    it cannot keep a session past its client."""
    kind = type(backend)
    found = _durable_types.get(kind)
    if found is None:
        found = _durable_types[kind] = isinstance(backend, DurableSessions)
    if found:
        return backend  # type: ignore[return-value]
    name = getattr(backend, "name", type(backend).__name__)
    raise ConfigurationError(f"orphan_timeout_s: the {name} backend cannot keep a session past "
                             "its client (host, podman and docker can)")
