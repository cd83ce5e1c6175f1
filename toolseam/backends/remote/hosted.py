"""A session a ``RemoteServer`` hosts (``server.py``), and how the server makes its backend:
``Hosting`` from a client's spec (the default: the name table's backend), ``Adopting`` from a
kept durable session's handle (the default: the hosted kind's own ``from_handle``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ...seam.capabilities import durable_sessions
from ...seam.errors import ConfigurationError, HostError
from ...seam.handle import AttachError, SessionHandle
from ...seam.lifetime import Durable
from ...seam.protocol import BuiltinExec
from .. import backend_for_handle, create_backend
from ..agentlink.errors import error_answer
from ..snapshots import remove_branch_workspace
from . import copied
from .durable import KEPT_PARTS
from .egress import ServerEgress
from .spec import PLACED, HostedSpec

SESSION_LABEL = b"toolseam remote session key v1"
# What a spec becomes on this server, and what to do once its session ended (a Ray node makes
# its own engine's backend in a directory of its own, which goes with the session).
# A durable session's spec carries its lifetime in ``options["lifetime"]`` (put there by this
# server, never by a client). The second argument: a directory of this server's holding the
# caller's workspace (``copied.py``), the backend's workspace — None: the hosting's own. An
# attach builds the backend from the hosted session's handle.
# A hosting is a coroutine: a Ray node's takes a warm sandbox of its pool (``pool`` option).
Hosting = Callable[[HostedSpec, str | None],
                   Awaitable[tuple[BuiltinExec, Callable[[], None] | None]]]
Adopting = Callable[[SessionHandle], BuiltinExec]
# the requests of a durable session's lifetime besides open and close (ops.py)
LIFETIME_OPS = frozenset({"detach", "keep_state", "keep_backend_state"})


async def create_hosted(spec: HostedSpec, workspace: str | None = None
                        ) -> tuple[BuiltinExec, None]:
    """The default hosting: the name table's backend of that kind and options (on the
    caller's copied ``workspace`` when there is one)."""
    if spec.kind == PLACED:
        raise ConfigurationError("hosted: this server has no engine of its own to place a "
                                 "session on (a Ray node has); name the kind to host")
    if workspace is None:
        return create_backend(spec.kind, **spec.options), None
    if "workspace" in spec.options:
        raise ConfigurationError("hosted: a session whose workspace is the caller's copy "
                                 "names no workspace option of the server's")
    return create_backend(spec.kind, workspace=workspace, **spec.options), None


@dataclass
class HostedSession:
    key: bytes
    backend: BuiltinExec
    owner: object
    capabilities: frozenset[str]
    calls: set[asyncio.Task[Any]] = field(default_factory=set)
    egress: ServerEgress = field(default_factory=ServerEgress)
    exported: set[str] = field(default_factory=set)  # objects of the snapshots it took
    branch_workspace: str | None = None  # opened from a snapshot: this server's private dir
    after: Callable[[], None] | None = None  # the hosting's own end of it
    kept: SessionHandle | None = None  # durable: the hosted session's handle
    orphan_timeout_s: float = 0.0
    copied: str | None = None  # the caller's workspace, copied here (copied.py)
    image: str | None = None  # what its open's info said it runs (toolseam ps shows it)
    started: float = field(default_factory=time.time)  # wall clock: toolseam ps shows it
    served: int = 0  # requests answered so far (toolseam ps)
    killed: bool = False  # its sandbox ended from outside (server_operator.py)

    async def end(self, bring_back: bool = False) -> bytes | None:
        """Close the hosted backend and remove what the session had here; ``bring_back``: the
        copied workspace as it is after that close (None when nothing was copied)."""
        self.egress.close()
        try:
            await self.backend.close()
            if bring_back and self.copied is not None:
                return await copied.brought_back(self.copied)
            return None
        finally:
            if self.branch_workspace is not None:
                await asyncio.to_thread(remove_branch_workspace, self.branch_workspace)
            if self.after is not None:
                await asyncio.to_thread(self.after)
            if self.copied is not None:
                await asyncio.to_thread(copied.removed, self.copied)

    async def leave(self) -> None:
        """Detach (durable): the hosted session goes on, its orphan timeout running."""
        self.egress.close()
        await durable_sessions(self.backend).detach()


def adopt_hosted(handle: SessionHandle) -> BuiltinExec:
    """The default attach: the hosted kind reads its own handle back (not yet open)."""
    return backend_for_handle(handle, {})


def durable_answer(backend: BuiltinExec, handle: SessionHandle) -> dict[str, Any]:
    """What a durable open tells its client: the hosted session's handle, and the jobs and
    state the hosted backend found at its attach (a refusal of a part as its error answer)."""
    durable = durable_sessions(backend)
    state: dict[str, tuple[str, Any]] = {}
    for part in KEPT_PARTS:
        try:
            state[part] = ("ok", durable.kept_state(part))
        except AttachError as refused:
            state[part] = ("err", error_answer(refused))
    return {"handle": handle.model_dump(mode="json"), "jobs": durable.attached_jobs(),
            "state": state}



def durable_lifetime(given: object) -> Durable | None:
    """A durable open's lifetime (``{"orphan_timeout_s", "secret"}``: the hosted secret,
    durable.py), or None for an ephemeral one."""
    if given is None:
        return None
    timeout = given.get("orphan_timeout_s") if isinstance(given, dict) else None
    secret = given.get("secret") if isinstance(given, dict) else None
    if not (isinstance(timeout, int | float) and not isinstance(timeout, bool)
            and isinstance(secret, str)):
        raise HostError("open: a lifetime is {orphan_timeout_s: seconds, secret: string}")
    return Durable(orphan_timeout_s=float(timeout), secret=secret)
