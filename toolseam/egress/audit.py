"""Audit: one event per connection attempt through the proxy.

Events carry no header, no request line and no body — only the destination, the verdict and the
byte counts — and every text that leaves the proxy (an event's ``reason``, a log line, an error
response) passes :meth:`Redactor.scrub`, so a credential value cannot reach the sandbox, a log or
a result even when an upstream echoes it into an error message.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

log = logging.getLogger("toolseam.egress")

Kind = Literal["connect", "http", "tcp", "dns"]
REDACTED = "[redacted]"


class Redactor:
    """Replaces every known credential value in a text."""

    def __init__(self, secrets: Iterable[str]) -> None:
        # Longest first, so a value containing another is replaced whole.
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text


@dataclass
class EgressEvent:
    """One attempt: where to, allowed or refused and why, bytes each way, how long."""

    host: str
    port: int
    kind: Kind
    """``connect`` (a CONNECT tunnel, intercepted or not), ``http`` (an absolute-URI request),
    ``tcp`` (a captured connection: a program dialled the address the sandbox's resolver gave
    the name) or ``dns`` (a name the resolver refused: no rule grants it any port)."""
    allowed: bool = False
    reason: str = ""
    """Why refused (or which rule allowed it); for an allowed attempt that failed, the failure."""
    status: int = 0
    """The status the proxy answered the client with (200 for an established tunnel)."""
    address: str | None = None
    """The address connected to, when a connection was made."""
    intercepted: bool = False
    """TLS was terminated by the proxy to add credentials."""
    bytes_up: int = 0
    """Bytes from the sandbox to the upstream (after the proxy's request line and headers)."""
    bytes_down: int = 0
    """Bytes from the upstream to the sandbox."""
    started: float = field(default_factory=time.time)
    duration_s: float = 0.0
    pid: int | None = None
    """The process inside that opened the connection, where the agent could see it."""
    argv: list[str] = field(default_factory=list)
    """That process's first command-line words."""
    job: str | None = None
    """The job (a ``bash`` command) that process belongs to."""
    call: str | None = None
    """The tool call that started that job."""


def attribute(event: EgressEvent, origin: Mapping[str, Any] | None,
              call_of: Callable[[str], str | None]) -> None:
    """Name on ``event`` the process, job and call that opened it (what the agent saw)."""
    if not origin:
        return
    if isinstance(origin.get("pid"), int):
        event.pid = origin["pid"]
    argv = origin.get("argv")
    if isinstance(argv, list):
        event.argv = [str(word) for word in argv]
    if isinstance(origin.get("job"), str):
        event.job = origin["job"]
        event.call = call_of(event.job)


class AuditLog:
    """Collects events, calls the listener, logs one line per event. Keeps the last ``kept``
    (a sandbox opening connections in a loop must not grow this process without bound); the
    listener and the log lines see every one."""

    def __init__(self, redactor: Redactor, listener: Callable[[EgressEvent], None] | None,
                 kept: int = 10_000) -> None:
        self._redactor = redactor
        self._listener = listener
        self._events: deque[EgressEvent] = deque(maxlen=kept)
        self.count = 0  # events recorded since the start, kept or not

    def record(self, event: EgressEvent, began: float) -> None:
        event.duration_s = round(time.monotonic() - began, 6)
        event.reason = self._redactor.scrub(event.reason)
        self._events.append(event)
        self.count += 1
        verdict = "allowed" if event.allowed else "refused"
        log.info("egress %s %s:%s %s (%s) status=%s up=%d down=%d%s", event.kind, event.host,
                 event.port, verdict, event.reason, event.status, event.bytes_up, event.bytes_down,
                 " intercepted" if event.intercepted else "")
        if self._listener is not None:
            self._listener(event)

    def events(self) -> list[EgressEvent]:
        return list(self._events)

    def since(self, count: int) -> list[EgressEvent]:
        """The events recorded after the first ``count`` (those still kept), oldest first."""
        newer = min(self.count - count, len(self._events))
        return list(itertools.islice(self._events, len(self._events) - newer, None)) if newer > 0 else []
