"""``ObservedSession``: what the telemetry (``telemetry.py``) and the live-session registry
(``live.py``) read of a session's observer.

``hook.SessionObserver`` drives both, so neither may import it (a circle, issue 47): they declare
here, below all three, the little of it they read, and the observer is one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..seam.capabilities import SandboxUsage
from .meter import SessionMeter


class ObservedSession(Protocol):
    """One session's accounting, as its spans, metrics and ``toolseam ps`` row read it."""

    @property
    def session_id(self) -> str: ...

    @property
    def backend(self) -> str: ...  # the backend's name, as the session was opened with it

    @property
    def attributes(self) -> dict[str, Any]: ...  # every span's: session id, backend, image, node

    @property
    def meter(self) -> SessionMeter: ...

    @property
    def usage(self) -> SandboxUsage: ...  # sampled just before the sandbox goes

    @property
    def secrets(self) -> Callable[[], list[str]]: ...  # values masked out of recorded content
