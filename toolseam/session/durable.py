"""Sessions that outlive their client (docs/sessions.md): what ``Toolkit.handle``,
``Toolkit.detach`` and ``Toolkit.attach`` do, kept out of ``toolkit.py``.

A durable session is one whose settings set ``orphan_timeout_s`` above 0, or whose backend was
built with ``lifetime=Durable(...)`` (``seam/lifetime.py``): the backend, built with that
lifetime, starts a durable agent (``toolseam_agent/session_socket.py``) — the host's in a process
of its own (``backends/host_durable.py``), a container's as its pid 1
(``backends/containers/lifetimes/durable.py``). The toolkit keeps its own state (settings, base dir,
jobs table, pinned shell, environment) with the agent after every call that changes it, so a
client killed with SIGKILL loses nothing another process cannot get back by attaching.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from typing import Any, TypeVar

from ..backends import backend_for_handle
from ..backends.agentlink.durable import canonical_state
from ..builtins import BUILTIN_NAMES
from ..policy.settings import parse_settings
from ..seam.capabilities import durable_sessions, lifetime_of
from ..seam.errors import ConfigurationError, CouldNotRunError
from ..seam.handle import AttachError, SessionHandle
from ..seam.lifetime import BackendLifetime
from ..seam.lifetime import Durable as DurableOption
from ..seam.protocol import BuiltinExec
from .toolkit_view import ToolkitView

STATE_VERSION = 1
Attached = TypeVar("Attached", bound=ToolkitView)  # the toolkit ``attach`` makes


async def detach(backend: BuiltinExec) -> None:
    """Close this client's connection and parts; the sandbox and its jobs go on."""
    await durable_sessions(backend).detach()


# --- the toolkit's own state, kept with the agent ---------------------------------------------
def session_state(tk: ToolkitView) -> dict[str, Any]:
    return {"v": STATE_VERSION, "session_id": tk.session_id, "base_dir": tk.base_dir,
            "confine": tk.confine, "settings": tk.settings.model_dump(mode="json"),
            "tools": sorted(tk.enabled_builtins),
            "session": tk.services.saved()}




def restore(tk: ToolkitView, state: dict[str, Any], agent_jobs: list[dict[str, Any]]) -> list[int]:
    """Put the saved state back; jobs the agent holds that the table lacks (a call in flight
    when the client died or detached) are taken over as kept jobs — one that ended while no
    client was attached too, so its output is not lost (issue 45). Returns their ids."""
    tk.services.restore(state["session"])
    table = tk.services.jobs
    known = {j.backend_job for j in table.all()}
    taken = []
    for found in agent_jobs:
        if found["job"] in known:
            continue
        job = table.take_over(found["job"], str((found.get("argv") or [""])[-1]),
                              int(found.get("pid", 0)), float(found.get("started", 0.0)))
        if found.get("state") != "running":
            job.state = "exited"
        taken.append(job.id)
    return taken


def toolkit_options(state: dict[str, Any], handle: SessionHandle) -> dict[str, Any]:
    """The Toolkit arguments the saved state fixes."""
    if state.get("v") != STATE_VERSION or state.get("session_id") != handle.session_id:
        raise AttachError("protocol", "the session's saved state is not this toolseam's "
                          f"(version {state.get('v')!r})")
    return {"settings": parse_settings(dict(state["settings"]), "the session's settings"),
            "base_dir": state["base_dir"], "confine_to_base_dir": bool(state["confine"]),
            "session_id": handle.session_id,
            "tools": {name: name in state["tools"] for name in _all_builtin_names()}}


def _all_builtin_names() -> tuple[str, ...]:
    return tuple(BUILTIN_NAMES)


# --- the lifetime the toolkit holds ------------------------------------------------------------
class Durable:
    """A session that outlives its client: chosen once, when the toolkit is made (settings with
    ``orphan_timeout_s`` above 0, or a backend built durable) or by ``attach``. Its backend is
    built with ``backend_lifetime``; the toolkit tells it when the session opened and when its
    state changed; it keeps that state with the agent."""

    def __init__(self, secret: str, orphan_timeout_s: float,
                 restore: dict[str, Any] | None = None) -> None:
        self.secret = secret
        self.orphan_timeout_s = orphan_timeout_s
        self.restore = restore  # an attach's state, put back at open
        self.adopted = restore is not None  # the sandbox was there before this client
        self._digest = ""  # of the state the agent has

    @property
    def backend_lifetime(self) -> BackendLifetime:
        """What a backend built for this session by name is built with."""
        return DurableOption(secret=self.secret, orphan_timeout_s=self.orphan_timeout_s)

    def before_open(self, backend: BuiltinExec) -> None:
        """The backend must have been built with this session's lifetime (its kind refuses by
        name when it keeps no session past its client)."""
        built = lifetime_of(durable_sessions(backend))
        if not isinstance(built, DurableOption) or built.secret != self.secret:
            raise ConfigurationError(
                f"orphan_timeout_s: this {getattr(backend, 'name', 'backend')} backend was not "
                "built with this session's lifetime, and a backend's lifetime is chosen when it "
                "is built: build it with lifetime=Durable(...) (toolseam.seam.lifetime), or "
                "give the Toolkit the backend's name")

    async def opened(self, tk: ToolkitView) -> None:
        """An attach puts its state back; then the agent gets it."""
        if self.restore is not None:
            state, self.restore = self.restore, None
            tk.adopted_jobs = restore(tk, state, durable_sessions(tk.backend).attached_jobs())
        await self.changed(tk)

    async def changed(self, tk: ToolkitView) -> None:
        """Give the agent the toolkit's state when it changed (one digest compare otherwise).
        A failure is the next call's to report: the result in hand is not lost over it."""
        durable = durable_sessions(tk.backend)
        await durable.keep_backend_state()  # copy mode's baseline, when an upload moved it
        state = session_state(tk)
        text = canonical_state(state)  # sealed as this text, and compared by its digest
        digest = hashlib.sha256(text.encode()).hexdigest()
        if self._digest == digest:
            return
        try:
            await durable.keep_state("toolkit", state, text)
        except (CouldNotRunError, ConfigurationError):
            return
        self._digest = digest

    def handle(self, tk: ToolkitView) -> SessionHandle:
        return durable_sessions(tk.backend).durable_handle(tk.session_id, self.secret)

    async def detach(self, tk: ToolkitView) -> None:
        await self.changed(tk)
        await detach(tk.backend)


async def attach(make: Callable[..., Attached], handle: SessionHandle | str,
                 options: dict[str, Any]) -> Attached:
    """The session ``handle`` names, continued: its backend built to attach, then a toolkit
    ``make`` builds (``Toolkit`` itself: its class is passed in, this module being one of its
    parts) with the state the agent kept, opened."""
    if isinstance(handle, str):
        handle = SessionHandle.from_json(handle)
    backend_options = dict(options.pop("backend_options", None) or {})
    fixed = {"settings", "base_dir", "confine_to_base_dir", "session_id", "tools", "backend",
             "lifetime"}
    clash = sorted(fixed & set(options))
    if clash:
        raise ConfigurationError(f"attach: {', '.join(clash)} come from the session itself")
    backend = backend_for_handle(handle, backend_options)  # built to attach to it
    try:
        await backend.open()
        state = durable_sessions(backend).kept_state("toolkit")
        if not isinstance(state, dict):
            raise AttachError("protocol", "the session kept no toolkit state")
        tk = make(backend, **toolkit_options(state, handle), **options,
                  lifetime=Durable(handle.secret, 0, restore=state))
    except BaseException:
        await _let_go(backend)
        raise
    try:
        await tk.open()
    except BaseException:
        await _let_go(backend)
        raise
    return tk


async def _let_go(backend: BuiltinExec) -> None:
    """Drop this client's connection without ending the session (nothing killed by mistake)."""
    with contextlib.suppress(Exception):
        await detach(backend)
