"""``SessionObserver``: the one object a ``Toolkit`` holds for accounting, traces and metrics.

The toolkit hands it each call (as the coroutine that runs it), each egress connection, and its
lifecycle steps; without telemetry it only counts, and ``opentelemetry`` is never imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from ..backends import backend_kind
from ..builtins import CallContext, ToolResult
from ..seam.capabilities import ResourceUsage, SandboxUsage, supports
from ..seam.errors import CouldNotRunError, HostError
from ..seam.models import SandboxInfo
from ..seam.protocol import BuiltinExec
from . import config
from .live import LIVE, LiveSession
from .meter import SessionMeter
from .report import SessionReport

if TYPE_CHECKING:
    from ..egress.audit import EgressEvent
    from .telemetry import Telemetry

_log = logging.getLogger("toolseam.session")


class SessionObserver:
    """Accounting for one session, and its spans and metrics when telemetry is on."""

    def __init__(self, session_id: str, backend: str,
                 secrets: Callable[[], list[str]] = list) -> None:
        self.session_id = session_id
        self.backend = backend
        self.meter = SessionMeter()
        self.telemetry: Telemetry | None = config.active()
        self.secrets = secrets  # masked out of recorded content
        self.attributes: dict[str, Any] = {"session.id": session_id,
                                           "toolseam.backend": backend}
        self.usage = SandboxUsage()
        self.report: SessionReport | None = None
        self.opened = False

    async def call(self, name: str, ctx: CallContext | None, args: Any,
                   run: Awaitable[ToolResult]) -> ToolResult:
        """Run one call, counted (and traced)."""
        telemetry = self.telemetry
        if telemetry is not None:
            return await telemetry.traced_call(self, name, ctx, args, run)
        try:
            result = await run
        except CouldNotRunError:
            self.meter.record("could_not_run", ctx)
            raise
        except BaseException:
            self.meter.record("raised", ctx)
            raise
        self.meter.record("ok" if not result.is_error else (
            "could_not_run" if result.metadata.get("failure") == "could_not_run" else "error"),
            ctx)
        return result

    def egress(self, event: EgressEvent) -> None:
        self.meter.note_egress(event.host, event.allowed, event.bytes_up + event.bytes_down)
        if self.telemetry is not None:
            self.telemetry.egress(self, event)

    @contextlib.contextmanager
    def lifecycle(self, step: str, **attributes: Any) -> Iterator[None]:
        """A span for a step of the session's life (open, attach, close, copy-back, and the
        branching steps: snapshot, restore, fork, keep)."""
        if self.telemetry is None:
            yield
            return
        with self.telemetry.lifecycle(self, step, attributes):
            yield

    def opened_on(self, backend: BuiltinExec, info: SandboxInfo, durable: bool = False) -> None:
        """What the open found out: the backend's kind, its image and node (span attributes),
        as the backend's info says them."""
        name = backend.name
        with contextlib.suppress(HostError):
            name = backend_kind(name).name
        self.attributes["toolseam.backend.kind"] = name
        if info.image is not None:
            self.attributes["container.image.name"] = info.image
        if info.node is not None:
            self.attributes["toolseam.node"] = info.node
        self.opened = True
        LIVE.add(LiveSession(self, backend, asyncio.get_running_loop(), durable))
        if self.telemetry is not None:
            self.telemetry.session_opened(self)

    def left(self) -> None:
        """This process no longer holds the session (closed, or detached)."""
        LIVE.remove(self.session_id)

    async def sample(self, backend: object) -> None:
        """The sandbox's usage, just before it goes (its cgroup disappears with it)."""
        if supports(backend, ResourceUsage):
            with contextlib.suppress(Exception):  # accounting never fails a close
                self.usage = await cast(ResourceUsage, backend).resource_usage()

    def closed(self) -> SessionReport:
        """The session's report, made once and logged."""
        if self.report is None:
            self.left()
            self.report = self.meter.report(self.session_id, self.backend, self.usage)
            _log.info("%s", self.report.summary(), extra={"toolseam_report": self.report})
            if self.telemetry is not None and self.opened:
                self.telemetry.session_closed(self)
        return self.report


@contextlib.contextmanager
def pool_claim(pool_id: str, ready: int) -> Iterator[None]:
    """A pool handing out a sandbox: a ``toolseam pool claim`` span, the claims counter and
    the claim latency histogram (nothing when telemetry is off). ``ready``: warm sandboxes
    the pool held when asked."""
    telemetry = config.active()
    if telemetry is None:
        yield
        return
    attributes = {"toolseam.pool.id": pool_id, "toolseam.pool.ready": ready}
    started = time.perf_counter()
    outcome = "raised"
    try:
        with telemetry.lifecycle_span("pool claim", attributes):
            yield
        outcome = "ok"
    finally:
        point = {"toolseam.outcome": outcome}
        telemetry.pool_claims.add(1, point)
        telemetry.pool_claim_duration.record(time.perf_counter() - started, point)


@contextlib.contextmanager
def session_step(step: str) -> Iterator[None]:
    """A span for a step that is not yet any one session's (an attach, before the toolkit
    exists); nothing when telemetry is off."""
    telemetry = config.active()
    if telemetry is None:
        yield
        return
    with telemetry.lifecycle_span(step, {}):
        yield
