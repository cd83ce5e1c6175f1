"""toolseam: an agent's builtin tools through one seam, on the host or in a container."""

from importlib import metadata as _metadata
from typing import TYPE_CHECKING as _TYPE_CHECKING

from .backends import BACKENDS, create_backend
from .backends.host import HostBackend
from .backends.snapshots import RestoreResult, Snapshot
from .builtins import BUILTIN_NAMES, OutputEvent, ToolResult
from .observability import SessionReport, instrument, trace_parent, uninstrument
from .policy.limits import SandboxLimits
from .policy.readscope import ReadQuestion
from .policy.settings import Settings, load_settings, parse_settings
from .seam.handle import AttachError, SessionHandle
from .session.lazy_sandbox_pool import __getattr__  # noqa: F401 - SandboxPool on first use (a container extra)

if _TYPE_CHECKING:  # what type checkers see of the lazy name
    from .session.sandbox_pool import SandboxPool
from .seam.errors import (
    BackendUnavailable,
    ConfigurationError,
    CouldNotRunError,
    FileOpError,
    HostError,
    SessionClosedError,
    ShellChangedError,
    ShellNotFound,
    ToolseamError,
    UnknownShellError,
    UnknownToolError,
)
from .seam.interactive import (
    InteractiveLimitError,
    InteractiveUnsupportedError,
    ProcessExitedError,
    PtyOutput,
    UnknownProcessError,
)
from .seam.protocol import BuiltinExec
from .session.options import ToolkitOptions
from .session.sync import SyncToolkit
from .session.toolkit import HostTool, Toolkit

try:
    __version__ = _metadata.version("toolseam")
except _metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = [
    "BACKENDS", "BUILTIN_NAMES", "AttachError", "BackendUnavailable", "BuiltinExec",
    "ConfigurationError", "CouldNotRunError", "FileOpError", "HostBackend", "HostError", "HostTool",
    "InteractiveLimitError", "InteractiveUnsupportedError",
    "OutputEvent", "ProcessExitedError", "PtyOutput", "ReadQuestion", "RestoreResult",
    "SandboxLimits", "SandboxPool", "SessionClosedError", "SessionHandle", "SessionReport",
    "Settings", "ShellChangedError", "ShellNotFound", "Snapshot", "SyncToolkit",
    "ToolResult", "Toolkit", "ToolkitOptions", "ToolseamError", "UnknownProcessError", "UnknownShellError",
    "UnknownToolError", "__version__", "create_backend", "instrument", "load_settings",
    "parse_settings", "trace_parent", "uninstrument",
]
