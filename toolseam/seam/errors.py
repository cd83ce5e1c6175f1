"""Exceptions, drawn as the tree CONTRACT §2 describes::

    ToolseamError                 every exception toolseam raises (catch-all root)
    ├── HostError                 the HOST made a mistake: raised at construction or call time
    │   ├── ConfigurationError    an invalid option or settings value (names the field)
    │   │   ├── ShellNotFound     no shell resolves and bash is enabled   (SHELL_NOT_FOUND)
    │   │   └── UnknownShellError unknown, unavailable or wrong-platform shell id
    │   ├── ShellChangedError     the pinned shell changed before spawn   (COMMAND_SHELL_CHANGED)
    │   ├── UnknownToolError      a call named no enabled tool
    │   ├── BackendUnavailable    unknown backend name, or its extra is not installed
    │   └── SessionClosedError    the toolkit or backend was used after close
    ├── CouldNotRunError          the sandbox could not run the operation at all; carries a
    │                             ``CouldNotRun`` outcome (``reason``, ``retryable``,
    │                             ``cause``: one of a closed set, e.g. ``sandbox_lost``)
    └── FileOpError               a file operation failed in a way the MODEL can act on
                                  (not found, outside the base dir, not UTF-8 …); builtins turn
                                  it into a tool result, never let it reach the host

A command that ran and failed (any exit code, a timeout, an OOM-killed command) is not an
exception anywhere: it is a normal result (``JobStatus``).
"""

from __future__ import annotations

from .models import CouldNotRun, CouldNotRunCause


class ToolseamError(Exception):
    """Root of every exception toolseam raises."""


class HostError(ToolseamError):
    """The host made a mistake; ``code`` is a stable identifier."""

    code = "HOST_ERROR"


class ConfigurationError(HostError):
    code = "INVALID_CONFIGURATION"


class ShellNotFound(ConfigurationError):
    code = "SHELL_NOT_FOUND"


class UnknownShellError(ConfigurationError):
    code = "UNKNOWN_SHELL"


class ShellChangedError(HostError):
    code = "COMMAND_SHELL_CHANGED"


class UnknownToolError(HostError):
    code = "UNKNOWN_TOOL"


class BackendUnavailable(HostError):
    code = "BACKEND_UNAVAILABLE"


class SessionClosedError(HostError):
    code = "SESSION_CLOSED"


class UnknownJobError(HostError):
    """The sandbox holds no job by that id (it ended and was forgotten, or never was)."""

    code = "UNKNOWN_JOB"


class CouldNotRunError(ToolseamError):
    """The sandbox could not run the operation (engine down, image missing, agent crashed …)."""

    def __init__(self, reason: str, retryable: bool, cause: CouldNotRunCause = "other") -> None:
        super().__init__(reason)
        self.outcome = CouldNotRun(reason=reason, retryable=retryable, cause=cause)

    @property
    def reason(self) -> str:
        return self.outcome.reason

    @property
    def retryable(self) -> bool:
        return self.outcome.retryable

    @property
    def cause(self) -> CouldNotRunCause:
        """Why, as one of ``seam.models.CouldNotRunCause`` (``"sandbox_lost"``: the sandbox
        died under the call, not the command)."""
        return self.outcome.cause


class FileOpError(ToolseamError):
    """A file operation failed for a reason the model can act on.

    ``code`` is one of: not_found, is_directory, not_directory, not_regular, not_utf8,
    outside_base, permission, exists, too_large, stale, invalid, os_error.
    """

    def __init__(self, code: str, path: str, detail: str = "") -> None:
        super().__init__(f"{code}: {path}" + (f" ({detail})" if detail else ""))
        self.code = code
        self.path = path
        self.detail = detail
