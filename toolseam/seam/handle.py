"""``SessionHandle``: what another process needs to attach to a session that outlives its
client (docs/sessions.md) — a small value a supervisor stores as soon as the session is open.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import CouldNotRunError, HostError

HANDLE_VERSION = 1
AttachRefusal = Literal["wrong_secret", "ended", "in_use", "unsupported", "gone", "protocol",
                        "tampered"]


class AttachError(HostError):
    """``Toolkit.attach`` could not attach; ``reason`` says why, and nothing was stopped:
    ``wrong_secret`` (the handle's secret is not this session's), ``ended`` (the session's
    sandbox ended: closed, or orphaned past ``orphan_timeout_s``), ``gone`` (the engine no
    longer has its container), ``in_use`` (another client is attached), ``unsupported`` (this
    backend, mode or handle version cannot attach), ``protocol`` (not a toolseam agent),
    ``tampered`` (the state the session kept for its client does not carry the handle's seal:
    something in the sandbox rewrote it, and nothing of it is restored)."""

    code = "ATTACH_REFUSED"

    def __init__(self, reason: AttachRefusal, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class SessionHandle(BaseModel):
    """Where a session's sandbox is and the proof of the right to attach to it.

    It holds a secret: store it as you would a credential (its ``repr`` hides the secret;
    ``to_json`` does not)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(HANDLE_VERSION, description="The handle format.")
    backend: str = Field(
        pattern=r"^[a-z][a-z0-9-]{0,39}$",
        description="Which backend runs the sandbox: a name of the backend table "
        "(``toolseam.backends.KINDS``, a kind's variant such as ``podman-rootless`` included), "
        "whose class reads the handle back (``from_handle``); checked against the table "
        "when the handle is used.")
    endpoint: str | None = Field(None, description="The engine's URL; None for the host; a "
                                 "remote backend's: where its server is reached, the "
                                 "transport's address (``unix:DIR``, ``ray:NODE[@CLUSTER]``).")
    socket: str = Field(description="The agent's unix socket on the machine that runs it.")
    sandbox: str = Field(description="The sandbox's identity: a container id, the host "
                                     "agent's pid, or a remote backend's session id on its "
                                     "server.")
    workspace_mode: Literal["host", "bind", "copy"] = Field(
        description="How the sandbox has its workspace.")
    workspace: str = Field(description="The host directory the sandbox works in (or copies).")
    image: str | None = Field(None, description="The container image.")
    network: Literal["none", "bridge", "egress", "host"] = Field(
        "none", description="The sandbox's network mode (egress: the attaching process runs "
        "the proxy, with credentials from its own environment).")
    session_id: str = Field(description="The toolkit's session id.")
    secret: str = Field(repr=False, min_length=16, description="Proves the right to attach.")
    hosted: SessionHandle | None = Field(None, description="A remote backend's: the handle of "
                                         "the session its server hosts (its secret derived "
                                         "one-way from this one's: backends/remote/durable.py); "
                                         "None for every other backend.")

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str | bytes) -> SessionHandle:
        """A handle from ``to_json``'s text; anything else raises ``AttachError``."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise AttachError("protocol", f"not a session handle (not JSON: {exc})") from None
        if isinstance(data, dict) and data.get("version") not in (None, HANDLE_VERSION):
            raise AttachError("unsupported", f"session handle version {data.get('version')!r}; "
                              f"this toolseam reads version {HANDLE_VERSION}")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            fields = ", ".join(".".join(map(str, e["loc"])) or "(top level)" for e in exc.errors())
            raise AttachError("protocol", f"not a session handle: bad or missing {fields}"
                              ) from None


def attach_refused(error: dict[str, object]) -> AttachError | CouldNotRunError:
    """The agent's refusal of an ``attach`` (``toolseam_agent/session_socket.py``)."""
    reason = str(error.get("reason", "protocol"))
    message = str(error.get("message", ""))
    if reason in ("wrong_secret", "ended", "in_use", "protocol", "unsupported"):
        return AttachError(reason, message)  # type: ignore[arg-type]
    return CouldNotRunError(message, retryable=False)
