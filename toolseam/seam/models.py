"""Wire models of the seam: what crosses between the builtins and a backend.

Every model forbids unknown fields and is frozen; a union that crosses the boundary carries a
literal tag. None of them holds a policy, budget or permission: *where* an operation runs is
the backend's business, *whether* it may run is decided above the seam.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- outcomes -------------------------------------------------------------------------------
CouldNotRunCause = Literal[
    "sandbox_lost",       # the sandbox died under the call: removed, stopped, OOM-killed whole,
                          # its agent killed, its engine's node or Ray node gone
    "engine_unreachable", # no connection to the engine (or the cluster); the sandbox may live
    "image_missing",      # the image is not there and could not be pulled
    "agent_failed",       # the agent could not start, speaks another protocol, or faulted
    "refused",            # the sandbox would not be what was asked (limits, network, guard)
    "workspace_changed",  # the bind-mounted base dir was renamed, removed or replaced
    "copy_back_failed",   # the sandbox's changes could not come home (its container is kept)
    "busy",               # the channel stayed full, a pool had nothing to hand out
    "engine_error",       # the engine refused or failed a request for another reason
    "other",              # none of the above (spawn failures, host OS errors)
]
"""Why an operation could not run, as a closed set a program can filter on (an RL trainer drops
a rollout whose sandbox died, ``sandbox_lost``, rather than scoring it); the ``reason`` says it in
words."""
COULD_NOT_RUN_CAUSES: tuple[str, ...] = CouldNotRunCause.__args__  # type: ignore[attr-defined]


class CouldNotRun(_Wire):
    """The operation never ran: the sandbox or its engine failed, not the command."""

    outcome: Literal["could_not_run"] = "could_not_run"
    reason: str = Field(description="What failed, in words a host can log and a model can read.")
    retryable: bool = Field(description="True when the same request may succeed elsewhere or later.")
    cause: CouldNotRunCause = Field("other", description="Why, as one of a closed set.")


# --- exec part ------------------------------------------------------------------------------
MAX_MS = 2**31 - 1  # about 24.8 days
class SpawnRequest(_Wire):
    """Start one command as a job."""

    type: Literal["spawn"] = "spawn"
    job: str = Field(description="Caller-chosen job id, unique per backend session.")
    argv: list[str] = Field(min_length=1, description="Program and arguments; never parsed.")
    cwd: str = Field(description="Working directory, as the sandbox sees it.")
    env: dict[str, str] = Field(description="The complete environment of the command.")
    # Milliseconds are bounded by what the agents' timers take (a signed 32-bit count).
    deadline_ms: int | None = Field(
        None, ge=1, le=MAX_MS, description="The sandbox itself kills the job this long after start.")
    grace_ms: int = Field(2000, ge=0, le=MAX_MS, description="Between SIGTERM and SIGKILL when killing.")
    wait_ms: int | None = Field(
        None, ge=0, le=MAX_MS,
        description="Answer after this long even if the job still runs; None: when done.")
    stream: bool = Field(False, description="Send live output events while the job runs.")
    output_limit: int = Field(1 << 20, ge=2, description="Bytes kept per stream (head + tail).")
    forget_when_done: bool = Field(
        False, description="If the first answer is final, the sandbox forgets the job (no release).")


class OutputChunk(_Wire):
    """A piece of output, in arrival order relative to the other stream."""

    stream: Literal["stdout", "stderr"]
    text: str


class CaptureGap(_Wire):
    """The middle of a stream the capture did not keep (it keeps a head and a tail)."""

    at: int = Field(description="Character offset in the combined output where the tail begins.")
    stream: Literal["stdout", "stderr"]
    bytes: int = Field(description="Bytes dropped.")
    lines: int = Field(description="Line breaks among them.")
    line_start: bool = Field(description="The kept tail begins a line.")

    @model_validator(mode="before")
    @classmethod
    def _from_row(cls, value: Any) -> Any:
        # The agent sends a gap as a compact row [at, stream, bytes, lines, line_start].
        if isinstance(value, list | tuple) and len(value) == 5:
            return dict(zip(("at", "stream", "bytes", "lines", "line_start"), value, strict=True))
        return value


class JobStatus(_Wire):
    """Where a job stands: still running (with output so far) or finished."""

    outcome: Literal["ran"] = "ran"
    job: str
    pid: int = Field(description="The leader's pid, as the sandbox sees it.")
    state: Literal["running", "exited"]
    exit_code: int | None = Field(description="Exit status; -N when a signal N ended the leader.")
    timed_out: bool = Field(description="The job's deadline elapsed and the sandbox killed it.")
    killed: bool = Field(description="Killed on request (kill, release, shutdown).")
    killed_tree: bool | None = Field(
        description="After a kill: True only when no process of the job was left; else None.")
    leftovers_killed: int = Field(
        description="Processes still running after the leader exited, killed by the sandbox.")
    oom_killed: bool = Field(
        False, description="The kernel's OOM killer killed a process of the sandbox while it ran.")
    started: float = Field(description="Start time, seconds since the epoch.")
    duration_ms: int
    chunks: list[OutputChunk]
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    stdout_lines: int | None = Field(None, description="Line breaks the stream wrote in all.")
    stderr_lines: int | None = Field(None, description="Line breaks the stream wrote in all.")
    gaps: list[CaptureGap] = Field(
        default_factory=list, description="Where the capture dropped the middle of a stream.")
    sandbox_stopping: bool = Field(
        False, description="The agent killed the job because its sandbox was being stopped "
        "from outside (SIGTERM to the agent): the job did not fail, its sandbox died.")
    cpu_seconds: float | None = Field(
        None, description="CPU time (user + system) of the job's processes that were reaped; "
        "None where the backend cannot measure it.")
    memory_peak_bytes: int | None = Field(
        None, description="Peak resident memory of the job's largest reaped process; None "
        "where the backend cannot measure it.")

    @property
    def output(self) -> str:
        """stdout and stderr combined in arrival order."""
        return "".join(chunk.text for chunk in self.chunks)


# --- file part ------------------------------------------------------------------------------
class PathRef(_Wire):
    """A path as a tool gave it, the dir it is relative to, and whether it must stay inside."""

    base: str = Field(description="Absolute dir a relative path resolves against.")
    path: str
    confine: bool = Field(False, description="Refuse a path whose canonical form leaves base.")


class FileStat(_Wire):
    kind: Literal["file", "dir", "fifo", "symlink", "other", "missing"]
    canonical: str = Field(description="Absolute path with every existing symlink resolved.")
    size: int
    mode: int
    executable: bool
    links: int = Field(1, description="Hard links to the file (st_nlink).")
    inode: str = Field("", description="The file's identity, 'device:inode' (empty: unknown).")


class TextContent(_Wire):
    text: str
    size: int = Field(description="Size of the whole file in bytes.")


class PageRequest(_Wire):
    """Which lines to read and the bounds on what comes back."""

    offset: int = Field(1, ge=1, description="First line, counting from 1.")
    limit: int = Field(2000, ge=0, description="Most lines.")
    max_bytes: int = Field(50 * 1024, gt=0, description="About this many bytes of text at most.")
    max_line_chars: int = Field(2000, gt=0, description="Longer lines are cut to this.")


class TextPage(_Wire):
    lines: list[str]
    cut: list[int] = Field(description="Numbers of the lines that were cut.")
    next: int | None = Field(description="Offset of the first line not returned; None at the end.")
    total: int | None = Field(description="Number of lines in the file, once the end was read.")
    size: int = Field(description="Size of the whole file in bytes.")


class DirListing(_Wire):
    entries: list[str] = Field(description="Names, '/' after directories; unsorted, capped.")
    total: int


class ByteContent(_Wire):
    data: bytes
    size: int
    mode: int


class WriteResult(_Wire):
    bytes: int
    created: bool


class WriteOp(_Wire):
    op: Literal["write"] = "write"
    path: str
    data: bytes
    expect: str | None = Field(
        None, description='"absent", or the sha256 the caller based the change on.')
    keep_bom: bool = Field(False, description="Keep an existing file's UTF-8 byte-order mark.")
    private: bool = Field(False, description="A new file is made 0600 (only its owner reads it).")


class DeleteOp(_Wire):
    op: Literal["delete"] = "delete"
    path: str
    expect: str | None = None


ChangeOp = Annotated[WriteOp | DeleteOp, Field(discriminator="op")]


class ChangeSet(_Wire):
    """Writes and deletes that land all together or not at all."""

    base: str
    confine: bool = False
    ops: list[ChangeOp] = Field(min_length=1)


class CommitResult(_Wire):
    written: int
    deleted: int
    created: int


class GlobMatch(_Wire):
    """A compiled glob: the backend filters with it, the library still sorts and caps."""

    regex: str = Field(description="Python regex, matched in full.")
    basename: bool = Field(description="Match the file name only, not the relative path.")
    name_suffix: str | None = Field(
        None, description="Exact shortcut for regex: a file name matches iff it ends with this.")


class FileListing(_Wire):
    """Every matching regular file, relative to the walk root, in no particular order."""

    paths: list[str]
    unreadable_dirs: int


class GrepListing(_Wire):
    """Every matching line: ``(rel, line_number, text)``, in no particular order."""

    hits: list[tuple[str, int, str]]
    binary_files: int
    unreadable_files: int
    unreadable_dirs: int


class SandboxInfo(_Wire):
    """What a backend reports once its sandbox is up."""

    backend: str
    workspace: str = Field(description="The default base dir inside the sandbox.")
    platform: Literal["posix", "windows"] = "posix"
    pid_namespace: bool = Field(description="Commands cannot see processes outside the sandbox.")
    agent_pid: int | None = None
    cold_start_ms: int | None = Field(None, description="Container created to agent answering.")
    local: bool = Field(False, description="Paths and processes are this machine's own (host).")
    image: str | None = Field(None, description="The image the sandbox runs (a container's).")
    node: str | None = Field(None, description="The node it runs on, where a backend places "
                             "sandboxes on a cluster (a Ray node's id).")
    base_env: dict[str, str] | None = Field(
        None, description="The environment commands start from (before the host's policy); "
        "None: this process's own environment (a local sandbox).")


class SyncReport(BaseModel):
    """What one copy-back from a sandbox without a shared filesystem did to the base dir
    (paths relative to it). Conflicts kept the host's version; the sandbox's, where it had one,
    is beside it as ``NAME.toolseam-conflict``. Filled in as the copy-back goes, so not frozen."""

    model_config = ConfigDict(extra="forbid")
    added: list[str] = Field(default_factory=list)
    modified: list[str] = Field(default_factory=list)
    deleted: list[str] = Field(default_factory=list)
    conflicts: list[str] = Field(default_factory=list)
    refused: list[str] = Field(default_factory=list, description=(
        "Entries not brought home: names leaving the base dir, a symlink on the way, "
        "hard links, devices, fifos."))
    bytes_copied: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.added or self.modified or self.deleted or self.conflicts)


class TraceContext(_Wire):
    """A W3C trace context crossing to where a session's sandbox lives (a Ray node): the work
    done there continues the caller's trace. Both fields as the W3C Trace Context
    recommendation bounds them, so a peer can send nothing larger or stranger."""

    traceparent: str = Field(pattern=r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
    tracestate: str | None = Field(None, max_length=512, pattern=r"^[\x20-\x7e]*$")
