"""Which sandbox an MCP request belongs to, and what it remembers about its own client.

A session (stdio, or a 2025-11-25 HTTP session) owns one sandbox, closed with the session. A
2026-07-28 request over HTTP has no session; it belongs to a *principal* — the bearer token it
carried, or, on a unix-socket server without a token, the server's one local principal. A call
without a handle goes to its principal's *default* sandbox, so an ordinary client keeps its
files, /tmp and jobs from call to call. A client that wants more sandboxes passes
``"sandbox": "new"``; the server mints a *handle* (256 random bits) that the client passes back
as the ``sandbox`` argument. The table is keyed by the handle's digest, so a lookup's timing says
nothing about how much of a guessed handle was right, and a handle reaches a sandbox only for
the principal it was minted for.

Limits are per principal (decision 156): a principal at its most handle sandboxes has its own
least recently used idle one closed to make room, and is refused only while all of its own are
busy; no principal's use ever refuses another's. Sandboxes unused for ``idle_seconds`` close,
least recently used first, and all close at shutdown.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ...seam.errors import HostError
from ...session.toolkit import Toolkit

IDLE_SECONDS = 30 * 60  # as the SDK's HTTP sessions
MOST_HANDLES = 16  # handle sandboxes per principal; each is an agent process or a container
NEW = "new"  # the "sandbox" value that asks for another sandbox
LOCAL = "local"  # the principal of a unix-socket server without a token


class SandboxRefused(HostError):
    """A handle that names no open sandbox of this principal, or no room for another one."""

    code = "SANDBOX_REFUSED"


@dataclass(eq=False)
class Sandbox:
    """One client's sandbox and the approval questions put to that client only."""

    toolkit: Toolkit
    handle: str | None = None  # set for the handle-named sandboxes of sessionless clients
    principal: str | None = None  # whose it is (sessionless clients only)
    announced: bool = False  # the handle was given to the client in a result
    asked: dict[str, str] = field(default_factory=dict)  # nonce -> path, questions not yet answered
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0  # calls in flight: such a sandbox never idles out


def _key(handle: str) -> bytes:
    return hashlib.sha256(handle.encode("utf-8", "surrogatepass")).digest()


class Handles:
    """The sandboxes of sessionless clients: one default per principal, and minted handles."""

    def __init__(self, make: Callable[[], Toolkit], idle_seconds: float = IDLE_SECONDS,
                 most: int = MOST_HANDLES) -> None:
        self._make = make
        self.idle_seconds = idle_seconds
        self.most = most  # per principal
        self._open: dict[bytes, Sandbox] = {}
        self._defaults: dict[str, Sandbox] = {}

    def default(self, principal: str = LOCAL) -> Sandbox:
        """The principal's default sandbox, made on its first call."""
        sandbox = self._defaults.get(principal)
        if sandbox is None:
            sandbox = self._defaults[principal] = Sandbox(self._make(), principal=principal)
        return sandbox

    def mint(self, principal: str = LOCAL, toolkit: Toolkit | None = None
             ) -> tuple[Sandbox, list[Sandbox]]:
        """A new handle sandbox of ``principal`` (around ``toolkit``, a fork's child, or a new
        one), and the ones closed to make room for it (its own least recently used idle one;
        the caller closes them)."""
        own = sorted((box for box in self._open.values() if box.principal == principal),
                     key=lambda box: box.last_used)
        evicted: list[Sandbox] = []
        if len(own) >= self.most:
            idle = [box for box in own if box.busy == 0]
            if not idle:
                raise SandboxRefused(
                    f"your {len(own)} sandboxes are all running calls, the most one client "
                    "keeps; pass the \"sandbox\" handle of one of them, omit \"sandbox\" for "
                    "your default sandbox, or retry when a call ends")
            evicted = idle[:len(own) - self.most + 1]
            for box in evicted:
                del self._open[_key(box.handle or "")]
        handle = secrets.token_urlsafe(32)
        made = self._make() if toolkit is None else toolkit
        sandbox = self._open[_key(handle)] = Sandbox(made, handle=handle, principal=principal)
        return sandbox, evicted

    def get(self, handle: str, principal: str = LOCAL) -> Sandbox:
        sandbox = self._open.get(_key(handle))
        if sandbox is None or not secrets.compare_digest(sandbox.principal or "", principal):
            raise SandboxRefused(
                "no open sandbox has this handle (a sandbox closes after "
                f"{self.idle_seconds / 60:g} minutes unused, when its client opens more than "
                f"{self.most} (the least recently used first) and when the server stops); omit "
                f"\"sandbox\" to use your default sandbox, or pass \"{NEW}\" to open another")
        return sandbox

    def count(self, principal: str) -> int:
        return sum(box.principal == principal for box in self._open.values())

    def take_idle(self, now: float | None = None) -> list[Sandbox]:
        """Remove and return the sandboxes unused for ``idle_seconds``, least recently used
        first (the caller closes them); a default one is made again on its next call."""
        now = time.monotonic() if now is None else now
        idle = sorted(((key, box) for key, box in self._open.items()
                       if box.busy == 0 and now - box.last_used >= self.idle_seconds),
                      key=lambda item: item[1].last_used)
        taken = [self._open.pop(key) for key, _ in idle]
        for principal, box in list(self._defaults.items()):
            if box.busy == 0 and now - box.last_used >= self.idle_seconds:
                taken.append(self._defaults.pop(principal))
        return sorted(taken, key=lambda box: box.last_used)

    def take_all(self) -> list[Sandbox]:
        boxes = [*self._open.values(), *self._defaults.values()]
        self._open.clear()
        self._defaults.clear()
        return boxes
