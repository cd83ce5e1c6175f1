"""The results and errors of ``ray_sandbox.create``'s sandboxes, shaped as Ray's own
(``ray.experimental.sandbox``: ``ExecResult``, ``SandboxStatus``, the ``SandboxError`` kinds)
so code written for Ray's sandbox reads them unchanged. Plain classes: they cross Ray's
object store and pickle as they are."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass
class ExecResult:
    """How a command ended: ``exit_code`` (128 + the signal when one ended it), its output."""

    exit_code: int
    stdout: str
    stderr: str
    duration_seconds: float

    @property
    def duration_ms(self) -> float:
        return self.duration_seconds * 1000.0


ExecutionResult = ExecResult


class SandboxStatus(Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    TERMINATED = "TERMINATED"
    ERROR = "ERROR"


class SandboxError(Exception):
    """Base of the sandbox's own failures (not the command's: a command that fails is an
    ``ExecResult`` with its exit code)."""


class SandboxCreationError(SandboxError):
    """The sandbox could not be made (no engine, no image, a node lost while making it)."""


class SandboxTimeoutError(SandboxError):
    """A command ran past its ``timeout`` and was killed (with everything it started)."""


class SandboxExecError(SandboxError):
    """The sandbox could not run the call (the sandbox failed, not the command)."""


class SandboxNotFoundError(SandboxError):
    """No sandbox answers this handle: deleted, expired, ended by its node, or not yours."""
