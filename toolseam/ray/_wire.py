"""How the seam's failures cross a Ray call, and what a Ray failure means for a session.

Ray pickles exceptions, but the seam's carry constructor arguments pickling cannot rebuild
(``CouldNotRunError(reason, retryable)``), and Ray wraps whatever it carries in its own task
error. So the node actor answers ``("ok", value)`` or ``("err", kind, ...)`` and the caller
raises the seam's own exception again: the three failure kinds stay apart across machines.
"""

from __future__ import annotations

import pickle
from typing import Any

from ..seam import errors
from ..seam.models import COULD_NOT_RUN_CAUSES, CouldNotRunCause

Answer = tuple[Any, ...]

# A tool call that goes through Ray (not the direct path, direct.py) crosses as ONE bytes
# argument and comes back as bytes (decision 310): Ray serializes each argument and result of
# an actor call on its own, and a pydantic model or a tuple costs it 0.3-0.5 ms a time where
# bytes cost nothing measurable. The
# node unpickles what a caller sent — no more trust than Ray's own, which unpickles every
# argument of every call with cloudpickle; the secret is checked before anything runs.
_PROTOCOL = pickle.HIGHEST_PROTOCOL


def pack_call(sid: str, secret: str, method: str, args: tuple[Any, ...]) -> bytes:
    return pickle.dumps((sid, secret, method, args), _PROTOCOL)


def unpack_call(payload: bytes) -> tuple[str, str, str, tuple[Any, ...]]:
    sid, secret, method, args = pickle.loads(payload)  # trusted as Ray trusts its arguments (above)
    return str(sid), str(secret), str(method), tuple(args)


def pack_answer(answer: Answer) -> bytes:
    return pickle.dumps(answer, _PROTOCOL)


def unpack_answer(payload: bytes) -> Answer:
    answer: Answer = pickle.loads(payload)  # from the node this process placed on
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
