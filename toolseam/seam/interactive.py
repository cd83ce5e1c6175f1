"""Interactive processes at the seam: what one read returns, the errors, and the optional
capability a backend declares (``capabilities.InteractiveProcesses``).

Errors (all ``HostError``: the host asked for something the sandbox cannot give)::

    InteractiveUnsupportedError   the backend has no interactive processes
    InteractiveLimitError         64 are running already, or too much input is waiting
    UnknownProcessError           no such process (terminated, or its exit was read); a LookupError
    ProcessExitedError            the process ended: its input is not read
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from .errors import HostError

DEFAULT_ROWS, DEFAULT_COLS = 24, 80
MAX_READ_BYTES = 16 << 20


class InteractiveUnsupportedError(HostError):
    """The backend cannot run interactive processes."""

    code = "INTERACTIVE_UNSUPPORTED"


class InteractiveLimitError(HostError):
    """A limit on interactive processes was reached (the message says which)."""

    code = "INTERACTIVE_LIMIT"


class UnknownProcessError(HostError, LookupError):
    """No interactive process with this id: it was terminated, or a read reported its exit."""

    code = "UNKNOWN_PROCESS"


class ProcessExitedError(HostError):
    """The interactive process has ended; what was written to it was not all read."""

    code = "PROCESS_EXITED"


class PtyOutput(BaseModel):
    """What one read of an interactive process returned."""

    model_config = ConfigDict(frozen=True)

    data: bytes = Field(description="Output since the last read (at most max_bytes), as the "
                        "terminal gave it (CR LF line ends, escape sequences).")
    exited: bool = Field(description="The process has ended and this read took its last "
                         "output; its id is forgotten now.")
    exit_code: int | None = Field(default=None, description="Its exit status once exited "
                                  "(negative: the signal that ended it).")
    truncated_bytes: int = Field(default=0, description="Output dropped before this read: the "
                                 "sandbox keeps the newest 1 MiB not yet read.")

    @property
    def text(self) -> str:
        """``data`` as text (UTF-8, an invalid byte as U+FFFD)."""
        return self.data.decode("utf-8", "replace")


class PtyProcess(BaseModel):
    """An interactive process the sandbox has (``pty_list``): running, or ended with output
    not read yet."""

    model_config = ConfigDict(frozen=True)

    id: int
    pid: int = Field(description="Its pid in the sandbox.")
    argv: list[str]
    running: bool
    tty: bool = Field(description="On a terminal (False: on pipes).")
    started: float = Field(description="When it started (seconds since the epoch).")


__all__ = ["DEFAULT_COLS", "DEFAULT_ROWS", "MAX_READ_BYTES", "InteractiveLimitError",
           "InteractiveUnsupportedError", "ProcessExitedError", "PtyOutput", "PtyProcess",
           "UnknownProcessError"]
