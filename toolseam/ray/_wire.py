"""How the seam's failures cross a Ray call, and what a Ray failure means for a session.

Ray pickles exceptions, but the seam's carry constructor arguments pickling cannot rebuild
(``CouldNotRunError(reason, retryable)``), and Ray wraps whatever it carries in its own task
error. So the node actor answers ``("ok", value)`` or ``("err", kind, ...)`` and the caller
raises the seam's own exception again: the three failure kinds stay apart across machines.
"""

from __future__ import annotations

from typing import Any

from ..seam import errors
from ..seam.models import COULD_NOT_RUN_CAUSES, CouldNotRunCause, TraceContext

Answer = tuple[Any, ...]

def trace_context(value: object) -> TraceContext | None:
    """A request's trace context: a ``TraceContext`` (the codec validated it) or nothing."""
    if value is not None and not isinstance(value, TraceContext):
        raise TypeError("a call's trace context is not a TraceContext")
    return value


def encode(exc: BaseException) -> Answer:
    """A seam exception as plain values; anything else is a could-not-run naming it."""
    if isinstance(exc, errors.CouldNotRunError):
        return ("err", "could_not_run", exc.reason, exc.retryable, exc.cause)
    if isinstance(exc, errors.FileOpError):
        return ("err", "file_op", exc.code, exc.path, exc.detail)
    if isinstance(exc, errors.HostError):
        return ("err", "host", type(exc).__name__, str(exc))
    return ("err", "could_not_run", f"{type(exc).__name__}: {exc}", False)


def decode(answer: Answer, where: str) -> Any:
    """The value of an ``ok`` answer; raises the seam exception an ``err`` answer carries
    (a could-not-run's reason prefixed with ``where``, the node it happened on)."""
    if answer[0] == "ok":
        return answer[1]
    kind = answer[1]
    if kind == "file_op":
        raise errors.FileOpError(answer[2], answer[3], answer[4])
    if kind == "host":
        cls = getattr(errors, answer[2], None)
        if not (isinstance(cls, type) and issubclass(cls, errors.HostError)):
            cls = errors.HostError
        raise cls(answer[3])
    cause: CouldNotRunCause = answer[4] if len(answer) > 4 and answer[4] in COULD_NOT_RUN_CAUSES else "other"
    raise errors.CouldNotRunError(f"{where}: {answer[2]}", retryable=bool(answer[3]),
                                  cause=cause)
