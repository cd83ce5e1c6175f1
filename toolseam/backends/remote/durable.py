"""Durable sessions through the remote backend (docs/sessions.md, decision 476): the client's
``DurableSessions`` members, what its handle holds, and how a handle's transport is found
again in another process.

A ``RemoteBackend`` built with ``lifetime=Durable(...)`` asks its server for a durable session
of the hosted kind; when the client's connection ends (its process killed, or ``detach``), the
server detaches the hosted backend — the hosted session's own orphan timeout runs from then —
and keeps a record of it by the session's id (``kept.py``). The handle names the remote kind,
the transport's address (``unix:DIR``, ``ray:NODE[@CLUSTER]``), the session's id on its server
and the hosted session's own handle; ``from_handle`` builds a backend that ``open``s by
attaching to that record.

The handle's secret never reaches the server, as a local handle's never reaches its agent: the
server is sent ``wire_secret`` (it keeps only a one-way key of it, ``server.py``) and the
hosted backend is built with ``hosted_secret`` — each derived one-way from the handle's, so a
handle with a wrong secret is refused by both, and nothing the server holds gives the handle's.
"""

from __future__ import annotations

import hmac
import importlib
from typing import Any, Protocol, runtime_checkable

from ...seam.errors import BackendUnavailable, ConfigurationError, CouldNotRunError
from ...seam.handle import AttachError, SessionHandle
from ...seam.lifetime import BackendLifetime, Durable
from ...seam.models import SandboxInfo
from ..agentlink.errors import map_seam_error
from .egress import ClientEgress
from .transport import Transport

WIRE_LABEL = b"toolseam remote wire secret v1"
HOSTED_LABEL = b"toolseam remote hosted secret v1"
# what an attach brings back of the state a client kept (``session/durable.py`` keeps one part)
KEPT_PARTS = ("toolkit",)
# the transports a handle can name, by its address's scheme: imported when a handle is used
# (Ray is an extra)
TRANSPORTS: dict[str, tuple[str, str]] = {
    "unix": ("toolseam.backends.remote.unix", "UnixTransport"),
    "ray": ("toolseam.ray.transport", "RayTransport"),
}


def _derived(secret: str, label: bytes) -> str:
    return hmac.digest(secret.encode(), label, "sha256").hex()


def wire_secret(secret: str) -> str:
    """What a durable session's requests carry to its server in place of the handle's secret."""
    return _derived(secret, WIRE_LABEL)


def hosted_secret(secret: str) -> str:
    """The secret the server builds the hosted backend's durable session with."""
    return _derived(secret, HOSTED_LABEL)


@runtime_checkable
class Reconnectable(Protocol):
    """A transport another process can make again from an address (a unix socket's directory,
    a Ray node): the ones a durable session's handle can name."""

    def durable_address(self) -> str:
        """``scheme:rest`` (a scheme of ``TRANSPORTS``) once the transport has reached its
        server; ``ConfigurationError`` before."""

    @classmethod
    def at_address(cls, rest: str) -> Transport:
        """A new transport (not connected) to the server ``rest`` names."""


def transport_at(address: str) -> Transport:
    """The transport a handle's address names; ``AttachError`` for one this toolseam cannot
    make (an unknown scheme, an extra not installed)."""
    scheme, _, rest = address.partition(":")
    found = TRANSPORTS.get(scheme)
    if found is None or not rest:
        raise AttachError("unsupported", f"session handle: {address!r} is not a remote "
                          f"server's address (one of {', '.join(f'{s}:…' for s in TRANSPORTS)})")
    try:
        cls: Any = getattr(importlib.import_module(found[0]), found[1])
        made: Transport = cls.at_address(rest)
    except (ImportError, BackendUnavailable) as exc:
        raise AttachError("unsupported", f"session handle: the {scheme} transport cannot be "
                          f"made here ({exc})") from None
    except ConfigurationError as exc:
        raise AttachError("protocol", str(exc)) from None
    return made


class RemoteDurability:
    """``seam.capabilities.DurableSessions`` for ``RemoteBackend`` (client.py), from what the
    server's ``open`` answered (``server.py``: ``durable_answer``)."""

    name: str
    session_id: str
    transport: Transport
    _lifetime: BackendLifetime
    _hosted_handle: SessionHandle | None
    _kept: dict[str, Any]

    _closed: bool
    _info: SandboxInfo | None
    _over: CouldNotRunError | None
    _egress: ClientEgress | None

    async def _send(self, name: str, kwargs: dict[str, Any], on_event: Any = None) -> Any:
        raise NotImplementedError

    async def _end_session(self, request: str) -> None:
        raise NotImplementedError

    def _lifetime_opening(self) -> dict[str, Any]:
        """What ``open`` tells the server of the session's lifetime."""
        if not isinstance(self._lifetime, Durable):
            return {}
        if self._lifetime.adopt is not None:
            return {"attach": True}
        return {"lifetime": {"orphan_timeout_s": self._lifetime.orphan_timeout_s,
                             "secret": hosted_secret(self._lifetime.secret)}}

    def _durable_opened(self, answer: Any) -> None:
        """The hosted session's handle, and what an attach found kept (``server.py``)."""
        try:
            self._hosted_handle = SessionHandle.model_validate(dict(answer)["handle"])
        except Exception:  # noqa: BLE001 - whatever it is, it is not a durable open's answer
            raise CouldNotRunError(f"{self.transport.where} answered a durable open without "
                                   "its session's handle", retryable=False,
                                   cause="agent_failed") from None
        self._kept = answer

    async def _leave(self) -> None:
        """``detach``: the server lets the hosted session go on; this client's part ends."""
        if not isinstance(self._lifetime, Durable):
            raise ConfigurationError("this remote backend was built to end with its client "
                                     "(lifetime=Ephemeral): it cannot detach")
        await self._end_session("detach")

    @property
    def lifetime(self) -> BackendLifetime:
        return self._lifetime

    def durable_handle(self, session_id: str, secret: str) -> SessionHandle:
        hosted = self._hosted_handle
        if hosted is None or not isinstance(self._lifetime, Durable):
            raise ConfigurationError("this remote backend was built to end with its client "
                                     "(lifetime=Ephemeral), or is not open: it has no handle")
        if not hmac.compare_digest(secret, self._lifetime.secret):
            raise ConfigurationError("durable_handle: not this session's secret")
        if not isinstance(self.transport, Reconnectable):
            raise ConfigurationError(f"{self.transport.where} cannot be reached from another "
                                     "process: its sessions have no handle")
        return SessionHandle(backend=self.name, endpoint=self.transport.durable_address(),
                             socket=hosted.socket, sandbox=self.session_id,
                             workspace_mode=hosted.workspace_mode, workspace=hosted.workspace,
                             image=hosted.image, network=hosted.network,
                             session_id=session_id, secret=secret,
                             hosted=hosted.model_copy(update={"session_id": session_id}))

    async def detach(self) -> None:
        """End this client's part: the server detaches the hosted session and keeps it for an
        attach until its orphan timeout."""
        await self._leave()

    async def keep_state(self, part: str, state: Any, text: str | None = None) -> None:
        await self._send("keep_state", {"part": part, "state": state, "text": text})

    def kept_state(self, part: str) -> Any:
        if part not in KEPT_PARTS:
            raise ConfigurationError(f"kept_state: an attach through a remote server brings "
                                     f"back {', '.join(KEPT_PARTS)}, not {part!r}")
        found = self._kept.get("state", {}).get(part)
        if isinstance(found, tuple | list) and len(found) == 2 and found[0] == "err":
            raise _refusal(found[1])
        return found[1] if isinstance(found, tuple | list) and len(found) == 2 else None

    def attached_jobs(self) -> list[dict[str, Any]]:
        return [dict(job) for job in self._kept.get("jobs", ()) if isinstance(job, dict)]

    async def keep_backend_state(self) -> None:
        await self._send("keep_backend_state", {})


def _refusal(answer: Any) -> Exception:
    return map_seam_error(answer if isinstance(answer, dict) else {})
