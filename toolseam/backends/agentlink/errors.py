"""The one map from the agent's error answers to seam exceptions.

Every failure the agent reports — over a channel, or raised by its file code run in this
process — becomes a seam exception here, so every backend maps failures the same way.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Any

from toolseam_agent.errors import FsError
from toolseam_agent.wire import ErrorKind

from ...seam.errors import CouldNotRunError, FileOpError, UnknownJobError
from ...seam.interactive import InteractiveLimitError, ProcessExitedError

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
