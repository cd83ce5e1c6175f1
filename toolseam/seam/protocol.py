"""THE seam: ``BuiltinExec`` = an exec part + a file part. Backends implement it; builtins call
nothing else (no ``os``, no ``subprocess`` above this line).

Three failure kinds (CONTRACT §2) and how each travels through every method below:

* ran — a normal return value. A command's non-zero exit, timeout or OOM kill is a
  ``JobStatus``, never an exception.
* could not run — ``CouldNotRunError`` (engine unreachable, sandbox or agent died …).
* host error — a ``HostError`` subclass (used after close, unknown job id …).

File operations that fail for a reason the model can act on raise ``FileOpError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from pydantic import Field

from .errors import CouldNotRunError
from .models import (
    ByteContent,
    ChangeSet,
    CommitResult,
    DirListing,
    FileListing,
    FileStat,
    GlobMatch,
    GrepListing,
    JobStatus,
    OutputChunk,
    PageRequest,
    PathRef,
    SandboxInfo,
    SpawnRequest,
    SyncReport,
    TextContent,
    TextPage,
    WriteResult,
)

OutputCallback = Callable[[OutputChunk], None]


class ExecRequest(SpawnRequest):
    """A ``SpawnRequest`` with what only the raw exec API (``toolseam.session.raw``) asks of a backend:
    stdin and a user. A backend that cannot honour them refuses (``CouldNotRunError`` whose
    reason names the problem); the bash tool never sets them."""

    stdin_file: str | None = Field(
        None, description="A file in the sandbox to read as stdin; the sandbox removes it once "
        "the job holds it open. None: /dev/null.")
    user: str | None = Field(None, description="Run as this user (name or uid) of the sandbox.")
    env_given: list[str] = Field(
        default_factory=list, description="Variables the caller set (a user switch's passwd "
        "HOME/USER/LOGNAME do not replace them).")
    keep_detached: bool = Field(
        False, description="What the command leaves running outlives it (background jobs; at "
        "a timeout, what moved to a session of its own); the session's close ends them.")


@runtime_checkable
class ExecPart(Protocol):
    """Opaque process execution: argv in; output chunks and an exit status out; plus kill."""

    async def start(self, request: SpawnRequest, on_output: OutputCallback | None = None
                    ) -> JobStatus:
        """Start ``request.argv`` as a job owned by the sandbox.

        Answers when the job is done, or after ``request.wait_ms`` with state ``running`` and
        the output so far; the job keeps running until done, killed, or its deadline.
        ``on_output`` receives live chunks when ``request.stream`` is set.

        Raises:
            CouldNotRunError: the sandbox could not spawn (shell missing, ENOMEM, agent gone).
            FileOpError: the working directory does not exist (code ``not_found``).
        """

    async def wait(self, job: str, wait_ms: int | None) -> JobStatus:
        """The job's status once done, or after ``wait_ms`` (None: until done).

        Raises:
            CouldNotRunError: the sandbox is gone.
            HostError: no such job.
        """

    async def kill(self, job: str) -> JobStatus:
        """Kill the whole job (TERM, grace, KILL) inside the sandbox; answer when nothing is left.

        Raises:
            CouldNotRunError: the sandbox is gone.
            HostError: no such job.
        """

    async def release(self, job: str) -> None:
        """Forget a job, killing it first if it still runs. Unknown ids are ignored.

        Raises:
            CouldNotRunError: the sandbox is gone.
        """


@runtime_checkable
class FilePart(Protocol):
    """Structured point operations and enumeration. Enumeration returns the FULL candidate
    set in any order: a backend never sorts or caps what reaches the model."""

    async def stat(self, ref: PathRef) -> FileStat:
        """What is at the path; kind ``missing`` when nothing. Raises: FileOpError."""

    async def read_text(self, ref: PathRef, offset: int | None = None, limit: int | None = None,
                        refuse_above_bytes: int | None = None) -> TextContent:
        """UTF-8 text, universal newlines; with offset/limit only that line window.

        Raises:
            FileOpError: not_found, is_directory, not_regular, not_utf8, too_large, outside_base.
        """

    async def read_page(self, ref: PathRef, page: PageRequest) -> TextPage:
        """A bounded page of lines: memory is bounded by the page, whatever the file's shape.

        Raises:
            FileOpError: as read_text, plus binary (NUL bytes early in the file) and past_end
                (an offset after the last line; detail: the line count).
        """

    async def list_dir(self, ref: PathRef, cap: int) -> DirListing:
        """A directory's entries, unsorted, at most ``cap`` (``total`` counts all).

        Raises: FileOpError (not_found, not_directory, outside_base).
        """

    async def read_bytes(self, ref: PathRef, refuse_above_bytes: int | None = None
                         ) -> ByteContent:
        """The raw bytes of a regular file. Raises: FileOpError."""

    async def write(self, ref: PathRef, data: bytes, keep_bom: bool = False) -> WriteResult:
        """Atomic write (temp file beside it, fsync, rename); parents created; mode kept; a
        file whose mode is read-only refused (``permission``). With ``keep_bom``, an existing
        file's UTF-8 byte-order mark stays when ``data`` has none.

        Raises: FileOpError.
        """

    async def commit(self, change: ChangeSet) -> CommitResult:
        """Apply every write and delete, or none: a failure rolls back what was applied.

        Raises: FileOpError (``stale`` when an ``expect`` no longer holds).
        """

    async def list_files(self, ref: PathRef, match: GlobMatch | None = None) -> FileListing:
        """Every regular file under the root (a file root: that file) that ``match`` accepts.

        Raises: FileOpError (root missing, outside the base, not a dir or file).
        """

    async def grep(self, ref: PathRef, pattern: str, include: GlobMatch | None = None,
                   deadline_ms: int | None = None) -> GrepListing:
        """Every line matching the Python regex ``pattern`` in UTF-8 files under the root.

        Bounded: a hit's text is at most 4096 characters; a file with a NUL byte in its first
        16 KiB is binary; a long line is searched in its first MiB. The search never blocks the
        backend's other work, and stops at ``deadline_ms``.

        Raises: FileOpError (``timeout`` past the deadline; detail: the deadline in ms).
        """


@runtime_checkable
class BuiltinExec(ExecPart, FilePart, Protocol):
    """A backend: one sandbox for one session."""

    name: str

    async def open(self) -> SandboxInfo:
        """Bring the sandbox up (idempotent).

        Raises:
            CouldNotRunError: it cannot start — a configured backend fails closed, it never
                falls back to the host.
        """

    async def close(self) -> None:
        """Kill every job and tear the sandbox down. Idempotent; never raises."""


@runtime_checkable
class WorkspaceTransfer(Protocol):
    """Files between the host and the sandbox's workspace, for backends that have one apart
    from the host's (containers; the host backend's workspace *is* the host dir)."""

    async def sync(self) -> SyncReport:
        """Bring the sandbox's changes to the base dir home now (a no-op where the directory is
        shared). Raises CouldNotRunError past the copy limit, writing nothing."""

    async def upload(self, local: str, dest: str) -> None:
        """Copy a host file or directory into the workspace as ``dest`` (relative to it)."""

    async def download(self, src: str, local: str) -> None:
        """Copy a workspace file or directory to ``local`` on the host (must not exist)."""

    @property
    def copy_back_error(self) -> CouldNotRunError | None:
        """Why close could not bring the changes home (the work is kept; this says how to
        recover it); None otherwise. ``Toolkit.close`` raises it."""
