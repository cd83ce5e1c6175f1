"""The one map from error answers to seam exceptions.

Every failure the agent reports — over a channel, or raised by its file code run in this
process — becomes a seam exception here, so every backend maps failures the same way. A seam
exception that crosses the remote backend's wire (``backends/remote/``) goes through the same
map: ``error_answer`` writes it in the agent's shape (two kinds the agent never sends —
``could_not_run`` and ``host`` — keep a could-not-run's cause and a host error's class), and
``map_seam_error`` reads it back; an agent's own answers are read by ``map_agent_error`` alone,
so nothing in a sandbox can pass for a host error.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Any

from toolseam_agent.errors import FsError
from toolseam_agent.wire import ErrorKind

from ...seam import errors as seam_errors
from ...seam import interactive
from ...seam.errors import CouldNotRunError, FileOpError, HostError, UnknownJobError
from ...seam.handle import AttachError, AttachRefusal
from ...seam.interactive import InteractiveLimitError, ProcessExitedError
from ...seam.models import COULD_NOT_RUN_CAUSES

SPAWN_FAILED = "could not start the command:"  # the reason's start for a spawn error


def map_agent_error(error: Mapping[str, Any]) -> Exception:
    """The agent's error answer as the seam exception it stands for."""
    kind = error.get("kind")
    message = str(error.get("message", ""))
    if kind == ErrorKind.FS:
        return FileOpError(str(error.get("code")), str(error.get("path", "")),
                           str(error.get("detail", "")))
    if kind == ErrorKind.SPAWN:
        if error.get("in_cwd"):
            return FileOpError("not_found", "", "working directory does not exist")
        transient = error.get("errno") in (errno.EAGAIN, errno.ENOMEM)
        return CouldNotRunError(f"{SPAWN_FAILED} {message}", retryable=transient)
    if kind == ErrorKind.UNKNOWN_JOB:
        return UnknownJobError(message)
    if kind == ErrorKind.LIMIT:
        return InteractiveLimitError(message)
    if kind == ErrorKind.PTY_EXITED:
        return ProcessExitedError(message)
    if kind == ErrorKind.ATTACH:  # a durable session lost this call's answer with a connection
        return CouldNotRunError(message, retryable=False)
    return CouldNotRunError(f"sandbox agent fault: {message}", retryable=True,
                            cause="agent_failed")


def from_fs_error(exc: FsError) -> Exception:
    """The agent's file error raised in this process, through the same map."""
    return map_agent_error({"kind": ErrorKind.FS, **exc.to_wire()})


# the kinds only the remote wire carries (never read from an agent)
COULD_NOT_RUN = "could_not_run"
HOST = "host"
# every host error by its stable code: one answer names its class without naming a class
_HOST_ERRORS: dict[str, type[HostError]] = {
    found.code: found for module in (seam_errors, interactive) for found in vars(module).values()
    if isinstance(found, type) and issubclass(found, HostError)}
_HOST_ERRORS[AttachError.code] = AttachError
ATTACH_REFUSALS: tuple[str, ...] = AttachRefusal.__args__  # type: ignore[attr-defined]


def error_answer(exc: BaseException) -> dict[str, Any]:
    """A seam exception as an error answer ``map_seam_error`` turns back into the same one;
    anything else is the hosting side's fault (the map's ``agent_failed``)."""
    if isinstance(exc, FileOpError):
        return {"kind": ErrorKind.FS, "code": exc.code, "path": exc.path, "detail": exc.detail}
    if isinstance(exc, CouldNotRunError):
        return {"kind": COULD_NOT_RUN, "message": exc.reason, "retryable": exc.retryable,
                "cause": exc.cause}
    if isinstance(exc, AttachError):
        return {"kind": HOST, "code": exc.code, "message": str(exc), "reason": exc.reason}
    if isinstance(exc, HostError):
        return {"kind": HOST, "code": exc.code, "message": str(exc)}
    return {"kind": ErrorKind.AGENT, "message": f"{type(exc).__name__}: {exc}"}


def map_seam_error(error: Mapping[str, Any]) -> Exception:
    """An ``error_answer`` as the seam exception it stands for (the agent's kinds as
    ``map_agent_error`` reads them)."""
    kind, message = error.get("kind"), str(error.get("message", ""))
    if kind == COULD_NOT_RUN:
        cause = error.get("cause")
        return CouldNotRunError(message, retryable=bool(error.get("retryable")),
                                cause=cause if cause in COULD_NOT_RUN_CAUSES else "other")
    if kind == HOST:
        found = _HOST_ERRORS.get(str(error.get("code")), HostError)
        if found is AttachError:
            reason = str(error.get("reason"))
            return AttachError(reason if reason in ATTACH_REFUSALS else "protocol",  # type: ignore[arg-type]
                               message)
        return found(message)
    return map_agent_error(error)
