"""Which sandbox an MCP request belongs to, and what it remembers about its own client.

A session (stdio, or a 2025-11-25 HTTP session) owns one sandbox, closed with the session. A
2026-07-28 request over HTTP has no session: its sandbox is named by a *handle* the server mints
on the client's first call and the client passes back as the ``sandbox`` argument (the
protocol's way to keep state across calls). A handle is 256 random bits; the table is keyed by
its digest, so a lookup's timing says nothing about how much of a guessed handle was right.
Without a sandbox's handle nobody reaches its jobs, files or approvals. Handle sandboxes close
after idling and at shutdown; a full table refuses new ones rather than evicting another
client's (decisions 61, 62). The operator's ``--shared-sandbox`` gives every client one sandbox.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .seam.errors import HostError
from .toolkit import Toolkit

IDLE_SECONDS = 30 * 60  # as the SDK's HTTP sessions
MOST_HANDLES = 64  # open handle sandboxes at once; each is an agent process or a container


class SandboxRefused(HostError):
    """A handle that names no open sandbox, or no room for another one."""

    code = "SANDBOX_REFUSED"


@dataclass(eq=False)
class Sandbox:
    """One client's sandbox and the approval questions put to that client only."""

    toolkit: Toolkit
    handle: str | None = None  # set for the handle-named sandboxes of sessionless clients
    announced: bool = False  # the handle was given to the client in a result
    asked: dict[str, str] = field(default_factory=dict)  # nonce -> path, questions not yet answered
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0  # calls in flight: such a sandbox never idles out


def _key(handle: str) -> bytes:
    return hashlib.sha256(handle.encode("utf-8", "surrogatepass")).digest()


class Handles:
    """The handle-named sandboxes of sessionless clients."""

    def __init__(self, make: Callable[[], Toolkit], idle_seconds: float = IDLE_SECONDS,
                 most: int = MOST_HANDLES) -> None:
        self._make = make
        self.idle_seconds = idle_seconds
        self.most = most
        self._open: dict[bytes, Sandbox] = {}

    def mint(self) -> Sandbox:
        if len(self._open) >= self.most:
            raise SandboxRefused(
                f"{self.most} sandboxes are open, the most this server keeps; pass the \"sandbox\" "
                f"handle an earlier result gave, or retry after idle ones close "
                f"({self.idle_seconds / 60:g} minutes unused)")
        handle = secrets.token_urlsafe(32)
        sandbox = self._open[_key(handle)] = Sandbox(self._make(), handle=handle)
        return sandbox

    def get(self, handle: str) -> Sandbox:
        sandbox = self._open.get(_key(handle))
        if sandbox is None:
            raise SandboxRefused(
                "no open sandbox has this handle (sandboxes close after "
                f"{self.idle_seconds / 60:g} minutes unused and when the server stops); "
                "omit \"sandbox\" to open a new one")
        return sandbox

    def take_idle(self, now: float | None = None) -> list[Sandbox]:
        """Remove and return the sandboxes unused for ``idle_seconds`` (the caller closes them)."""
        now = time.monotonic() if now is None else now
        idle = [key for key, box in self._open.items()
                if box.busy == 0 and now - box.last_used >= self.idle_seconds]
        return [self._open.pop(key) for key in idle]

    def take_all(self) -> list[Sandbox]:
        boxes = list(self._open.values())
        self._open.clear()
        return boxes
