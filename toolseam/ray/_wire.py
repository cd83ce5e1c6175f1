"""How the seam's failures cross a Ray call, and what a Ray failure means for a session.

Ray pickles exceptions, but the seam's carry constructor arguments pickling cannot rebuild
(``CouldNotRunError(reason, retryable)``), and Ray wraps whatever it carries in its own task
error. So the node actor answers ``("ok", value)`` or ``("err", kind, ...)`` and the caller
raises the seam's own exception again: the three failure kinds stay apart across machines.
"""

from __future__ import annotations

import pickle
from typing import Any

from ..backends.remote.codec import dumps, loads
from ..seam import errors
from ..seam.models import COULD_NOT_RUN_CAUSES, CouldNotRunCause, TraceContext

Answer = tuple[Any, ...]

# A tool call that goes through Ray (not the direct path, direct.py) crosses as ONE bytes
# argument and comes back as bytes (decision 310): Ray serializes each argument and result of
# an actor call on its own, and a pydantic model or a tuple costs it 0.3-0.5 ms a time where
# bytes cost nothing measurable. Both ends decode them as the direct path does (codec.py):
# seam models only, validated again (issue 44).


def pack_call(sid: str, secret: str, method: str, args: tuple[Any, ...],
              trace: TraceContext | None = None) -> bytes:
    """``trace``: the caller's span's context, when it traces (observability/across.py)."""
    return dumps((sid, secret, method, args, trace))


def unpack_call(payload: bytes) -> tuple[str, str, str, tuple[Any, ...], TraceContext | None]:
    sid, secret, method, args, trace = loads(payload)
    return str(sid), str(secret), str(method), tuple(args), trace_context(trace)


def trace_context(value: object) -> TraceContext | None:
    """A request's trace context: a ``TraceContext`` (the codec validated it) or nothing."""
    if value is not None and not isinstance(value, TraceContext):
        raise TypeError("a call's trace context is not a TraceContext")
    return value


def pack_answer(answer: Answer) -> bytes:
    return dumps(answer)


def unpack_answer(payload: bytes) -> Answer:
    """A node's answer, never trusted to name a class (a node actor may not be ours)."""
    try:
        answer = loads(payload) if isinstance(payload, bytes) else None
    except (pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise errors.CouldNotRunError(f"a Ray node answered what is not a toolseam answer "
                                      f"({exc})", retryable=False) from None
    if not (isinstance(answer, tuple) and answer and answer[0] in ("ok", "err")):
        raise errors.CouldNotRunError("a Ray node answered what is not a toolseam answer",
                                      retryable=False)
    return answer


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
