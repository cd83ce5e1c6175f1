"""The seam between the builtins and the backends: protocol, wire models, errors."""

from .errors import (
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
from .models import (
    ByteContent,
    ChangeSet,
    CommitResult,
    CouldNotRun,
    DeleteOp,
    FileListing,
    FileStat,
    GlobMatch,
    GrepListing,
    JobStatus,
    OutputChunk,
    PathRef,
    SandboxInfo,
    SpawnRequest,
    TextContent,
    WriteOp,
    WriteResult,
)
from .protocol import BuiltinExec, ExecPart, FilePart, OutputCallback

__all__ = [
    "BackendUnavailable", "BuiltinExec", "ByteContent", "ChangeSet", "CommitResult",
    "ConfigurationError", "CouldNotRun", "CouldNotRunError", "DeleteOp", "ExecPart",
    "FileListing", "FileOpError", "FilePart", "FileStat", "GlobMatch", "GrepListing",
    "HostError", "JobStatus", "OutputCallback", "OutputChunk", "PathRef", "SandboxInfo",
    "SessionClosedError", "ShellChangedError", "ShellNotFound", "SpawnRequest", "TextContent",
    "ToolseamError", "UnknownShellError", "UnknownToolError", "WriteOp", "WriteResult",
]
