"""toolseam: an agent's builtin tools through one seam, on the host or in a container."""

from .backends import BACKENDS, create_backend
from .backends.host import HostBackend
from .builtins import BUILTIN_NAMES, OutputEvent, ToolResult
from .policy.readscope import ReadQuestion
from .policy.settings import Settings, load_settings, parse_settings
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
from .seam.protocol import BuiltinExec
from .toolkit import HostTool, Toolkit

__version__ = "0.1.0"

__all__ = [
    "BACKENDS", "BUILTIN_NAMES", "BackendUnavailable", "BuiltinExec", "ConfigurationError",
    "CouldNotRunError", "FileOpError", "HostBackend", "HostError", "HostTool", "OutputEvent",
    "ReadQuestion", "SessionClosedError", "Settings", "ShellChangedError", "ShellNotFound",
    "ToolResult", "Toolkit", "ToolseamError", "UnknownShellError", "UnknownToolError",
    "__version__", "create_backend", "load_settings", "parse_settings",
]
