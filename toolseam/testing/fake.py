"""``FakeBackend``: an in-process backend with an in-memory tree and a tiny scripted shell.

For tests of the layers ABOVE the seam (builtins, policies, the stdio server) — fast, no
processes, no disk. It honours the seam's contract for everything it models and is bound to
the shared contract suite; it is never a stand-in for the real engines.

The shell understands ``;``-separated ``echo``/``printf`` (with ``>&2``), ``env``, ``sleep N``,
``exit N``, ``true`` and ``false`` — enough for the contract's exec checks. It has no symlinks,
FIFOs or permissions.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import posixpath
import re
import shlex
import time
from dataclasses import dataclass, field

from ..policy.environment import CONTAINER_BASE_ENV
from ..seam.errors import CouldNotRunError, FileOpError, HostError, SessionClosedError, UnknownJobError
from ..seam.models import (
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
    TextContent,
    TextPage,
    WriteResult,
)
from ..seam.protocol import ExecRequest, OutputCallback

BOM = b"\xef\xbb\xbf"

PRUNED = {".git", "node_modules"}


@dataclass
class _Job:
    request: SpawnRequest
    started: float
    chunks: list[tuple[str, str]] = field(default_factory=list)
    exit_code: int | None = None
    timed_out: bool = False
    killed: bool = False
    task: asyncio.Task[None] | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)
    ended: float | None = None


class FakeBackend:
    name = "fake"
    capabilities: frozenset[type] = frozenset()  # none of seam/capabilities.py's

    def __init__(self, workspace: str = "/workspace", files: dict[str, bytes] | None = None) -> None:
        self.workspace = workspace
        self.files: dict[str, bytes] = {}
        self.modes: dict[str, int] = {}
        self.dirs: set[str] = {"/", workspace, "/tmp", "/bin", "/usr", "/usr/bin"}
        self.files["/bin/sh"] = b"#!fake"
        self.modes["/bin/sh"] = 0o755
        for path, data in (files or {}).items():
            self._put(posixpath.join(workspace, path), data)
        self._jobs: dict[str, _Job] = {}
        self._closed = False
        self.fail_with: CouldNotRunError | None = None  # set to make every call could-not-run

    # --- helpers ------------------------------------------------------------------------
    def _guard(self) -> None:
        if self._closed:
            raise SessionClosedError("the fake backend was closed")
        if self.fail_with is not None:
            raise self.fail_with

    def _put(self, path: str, data: bytes) -> None:
        parent = posixpath.dirname(path)
        while parent not in self.dirs:
            self.dirs.add(parent)
            parent = posixpath.dirname(parent)
        self.files[path] = data

    def _resolve(self, ref: PathRef) -> str:
        if not ref.path or "\x00" in ref.path:
            raise FileOpError("invalid", ref.path, "empty path" if not ref.path else "NUL byte")
        path = posixpath.normpath(posixpath.join(ref.base, ref.path))
        if ref.confine:
            base = posixpath.normpath(ref.base)
            if path != base and not path.startswith(base.rstrip("/") + "/"):
                raise FileOpError("outside_base", ref.path)
        return path

    def _file(self, ref: PathRef) -> tuple[str, bytes]:
        path = self._resolve(ref)
        if path in self.dirs:
            raise FileOpError("is_directory", ref.path)
        if path not in self.files:
            raise FileOpError("not_found", ref.path)
        return path, self.files[path]

    # --- lifecycle ----------------------------------------------------------------------
    async def open(self) -> SandboxInfo:
        self._guard()
        return SandboxInfo(backend=self.name, workspace=self.workspace, pid_namespace=True,
                           base_env=dict(CONTAINER_BASE_ENV))

    async def close(self) -> None:
        for job in self._jobs.values():
            if job.task is not None:
                job.task.cancel()
        self._closed = True

    # --- files --------------------------------------------------------------------------
    async def stat(self, ref: PathRef) -> FileStat:
        self._guard()
        path = self._resolve(ref)
        if path in self.dirs:
            return FileStat(kind="dir", canonical=path, size=0, mode=0o755, executable=False)
        if path in self.files:
            mode = self.modes.get(path, 0o644)
            return FileStat(kind="file", canonical=path, size=len(self.files[path]), mode=mode,
                            executable=bool(mode & 0o111))
        return FileStat(kind="missing", canonical=path, size=0, mode=0, executable=False)

    async def read_text(self, ref: PathRef, offset: int | None = None, limit: int | None = None,
                        refuse_above_bytes: int | None = None) -> TextContent:
        self._guard()
        _, data = self._file(ref)
        windowed = offset is not None or limit is not None
        if not windowed and refuse_above_bytes is not None and len(data) > refuse_above_bytes:
            raise FileOpError("too_large", ref.path, str(len(data)))
        try:
            text = data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        except UnicodeDecodeError:
            raise FileOpError("not_utf8", ref.path) from None
        if windowed:
            start = (offset or 1) - 1
            lines = text.split("\n")
            text = "\n".join(lines[start : None if limit is None else start + limit])
            longest = max(map(len, lines[: None if limit is None else start + limit]), default=0)
            if refuse_above_bytes is not None and max(len(text), longest) > refuse_above_bytes:
                raise FileOpError("too_large", ref.path, f"a window of more than {refuse_above_bytes}")
        return TextContent(text=text, size=len(data))

    async def read_page(self, ref: PathRef, page: PageRequest) -> TextPage:
        self._guard()
        _, data = self._file(ref)
        if b"\0" in data[:8192]:
            raise FileOpError("binary", ref.path)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise FileOpError("not_utf8", ref.path) from None
        lines = [line.removesuffix("\r") for line in text.split("\n")]
        if lines[-1] == "":
            lines.pop()
        if page.offset > len(lines) and not (page.offset == 1 and not lines):
            raise FileOpError("past_end", ref.path, str(len(lines)))
        shown: list[str] = []
        cut: list[int] = []
        used = 0
        for number in range(page.offset, len(lines) + 1):
            line = lines[number - 1]
            was_cut = len(line) > page.max_line_chars
            line = line[: page.max_line_chars]
            size = len(line.encode()) + 1
            if len(shown) >= page.limit or (shown and used + size > page.max_bytes):
                return TextPage(lines=shown, cut=cut, next=number, total=None, size=len(data))
            if was_cut:
                cut.append(number)
            shown.append(line)
            used += size
        return TextPage(lines=shown, cut=cut, next=None, total=len(lines), size=len(data))

    async def list_dir(self, ref: PathRef, cap: int) -> DirListing:
        self._guard()
        path = self._resolve(ref)
        if path in self.files:
            raise FileOpError("not_directory", ref.path)
        if path not in self.dirs:
            raise FileOpError("not_found", ref.path)
        prefix = path.rstrip("/") + "/"
        names = {p[len(prefix):].split("/")[0] + ("/" if p in self.dirs or "/" in p[len(prefix):]
                                                  else "")
                 for p in [*self.files, *self.dirs] if p.startswith(prefix) and p != prefix}
        entries = sorted(names)
        return DirListing(entries=entries[:cap], total=len(entries))

    async def read_bytes(self, ref: PathRef, refuse_above_bytes: int | None = None
                         ) -> ByteContent:
        self._guard()
        path, data = self._file(ref)
        if refuse_above_bytes is not None and len(data) > refuse_above_bytes:
            raise FileOpError("too_large", ref.path, str(len(data)))
        return ByteContent(data=data, size=len(data), mode=self.modes.get(path, 0o644))

    async def write(self, ref: PathRef, data: bytes, keep_bom: bool = False) -> WriteResult:
        self._guard()
        path = self._resolve(ref)
        if path in self.dirs:
            raise FileOpError("is_directory", ref.path)
        created = path not in self.files
        if keep_bom and not created and self.files[path].startswith(BOM) and not data.startswith(BOM):
            data = BOM + data
        self._put(path, data)
        return WriteResult(bytes=len(data), created=created)

    async def commit(self, change: ChangeSet) -> CommitResult:
        self._guard()
        planned: list[tuple[str, bytes | None]] = []
        for op in change.ops:
            path = self._resolve(PathRef(base=change.base, path=op.path, confine=change.confine))
            current = self.files.get(path)
            if op.expect is not None:
                digest = None if current is None else hashlib.sha256(current).hexdigest()
                if (op.expect == "absent") != (digest is None) or (
                        op.expect != "absent" and digest != op.expect):
                    raise FileOpError("exists" if op.expect == "absent" else "stale", op.path)
            if op.op == "delete" and current is None:
                raise FileOpError("not_found", op.path)
            planned.append((path, op.data if op.op == "write" else None))
        created = 0
        for path, data in planned:  # all checks passed: nothing below can fail
            if data is None:
                del self.files[path]
            else:
                created += path not in self.files
                self._put(path, data)
        written = sum(1 for _, d in planned if d is not None)
        return CommitResult(written=written, deleted=len(planned) - written, created=created)

    def _walk(self, ref: PathRef) -> tuple[str, list[str]]:
        root = self._resolve(ref)
        if root in self.files:
            return posixpath.dirname(root), [root]
        if root not in self.dirs:
            raise FileOpError("not_found", ref.path)
        prefix = root.rstrip("/") + "/"
        found = []
        for path in self.files:
            if path.startswith(prefix):
                parts = path[len(prefix) :].split("/")
                if not any(part in PRUNED for part in parts[:-1]):
                    found.append(path)
        return root, found

    async def list_files(self, ref: PathRef, match: GlobMatch | None = None) -> FileListing:
        self._guard()
        root, found = self._walk(ref)
        paths = []
        for path in found:
            rel = posixpath.relpath(path, root)
            subject = rel.rpartition("/")[2] if match and match.basename else rel
            if match is None or (match.name_suffix is not None and subject.endswith(match.name_suffix)) \
                    or (match.name_suffix is None and re.fullmatch(match.regex, subject)):
                paths.append(rel)
        return FileListing(paths=paths, unreadable_dirs=0)

    async def grep(self, ref: PathRef, pattern: str, include: GlobMatch | None = None,
                   deadline_ms: int | None = None) -> GrepListing:
        self._guard()
        root, found = self._walk(ref)
        try:
            regex = re.compile(pattern)
        except re.error as exc:  # as the agent's search reports it
            raise FileOpError("bad_pattern", pattern, str(exc)) from None
        hits: list[tuple[str, int, str]] = []
        binary = 0
        for path in found:
            rel = posixpath.relpath(path, root)
            if include is not None:
                subject = rel.rpartition("/")[2] if include.basename else rel
                if not re.fullmatch(include.regex, subject):
                    continue
            try:
                text = self.files[path].decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
            except UnicodeDecodeError:
                binary += 1
                continue
            hits += [(rel, n, line) for n, line in enumerate(text.split("\n"), 1)
                     if regex.search(line)]
        return GrepListing(hits=hits, binary_files=binary, unreadable_files=0, unreadable_dirs=0)

    # --- exec ---------------------------------------------------------------------------
    async def start(self, request: SpawnRequest, on_output: OutputCallback | None = None
                    ) -> JobStatus:
        self._guard()
        if request.job in self._jobs:
            raise HostError(f"job id {request.job!r} is in use")
        if request.cwd not in self.dirs:
            raise FileOpError("not_found", request.cwd, "working directory does not exist")
        if isinstance(request, ExecRequest):  # the raw API's: no users, no stdin here
            if request.stdin_file is not None:
                self.files.pop(request.stdin_file, None)
                raise CouldNotRunError("the fake backend's shell reads no stdin",
                                       retryable=False)
            if request.user is not None:
                raise CouldNotRunError("user-unsupported: the fake backend has one user",
                                       retryable=False)
            # an argv, not a script: its words as one statement of the tiny shell
            request = request.model_copy(update={"argv": [shlex.join(request.argv)]})
        job = _Job(request, time.time())
        self._jobs[request.job] = job
        job.task = asyncio.get_running_loop().create_task(self._run(job, on_output))
        if request.deadline_ms is not None:
            asyncio.get_running_loop().call_later(request.deadline_ms / 1000, self._expire, job)
        status = await self.wait(request.job, request.wait_ms)
        if request.forget_when_done and status.state == "exited":
            self._jobs.pop(request.job, None)
        return status

    def _expire(self, job: _Job) -> None:
        if not job.done.is_set() and job.task is not None:
            job.timed_out = True
            job.task.cancel()

    async def _run(self, job: _Job, on_output: OutputCallback | None) -> None:
        try:
            job.exit_code = await _interpret(job.request.argv[-1], job.request.env, job.chunks,
                                             on_output)
        except asyncio.CancelledError:
            job.exit_code = -15
        finally:
            job.ended = time.time()
            job.done.set()

    def _job(self, job_id: str) -> _Job:
        job = self._jobs.get(job_id)
        if job is None:
            raise UnknownJobError(f"no job {job_id!r}")
        return job

    async def wait(self, job: str, wait_ms: int | None) -> JobStatus:
        self._guard()
        tracked = self._job(job)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(tracked.done.wait()),
                                   None if wait_ms is None else wait_ms / 1000)
        return _status(tracked)

    async def kill(self, job: str) -> JobStatus:
        self._guard()
        tracked = self._job(job)
        if not tracked.done.is_set() and tracked.task is not None:
            tracked.killed = True
            tracked.task.cancel()
            await tracked.done.wait()
        return _status(tracked)

    async def release(self, job: str) -> None:
        tracked = self._jobs.pop(job, None)
        if tracked is not None and tracked.task is not None:
            tracked.task.cancel()


def _status(job: _Job) -> JobStatus:
    done = job.done.is_set()
    chunks = [OutputChunk(stream=s, text=t) for s, t in job.chunks]
    out = sum(len(t.encode()) for s, t in job.chunks if s == "stdout")
    err = sum(len(t.encode()) for s, t in job.chunks if s == "stderr")
    end = job.ended if job.ended is not None else time.time()
    return JobStatus(job=job.request.job, pid=4242, state="exited" if done else "running",
                     exit_code=job.exit_code if done else None, timed_out=job.timed_out,
                     killed=job.killed, killed_tree=True if (job.killed or job.timed_out) else None,
                     leftovers_killed=0, started=job.started,
                     duration_ms=int((end - job.started) * 1000), chunks=chunks,
                     stdout_bytes=out, stderr_bytes=err, stdout_truncated=False,
                     stderr_truncated=False)


async def _interpret(script: str, env: dict[str, str], chunks: list[tuple[str, str]],
                     on_output: OutputCallback | None) -> int:
    status = 0
    for statement in filter(None, (s.strip() for s in script.split(";"))):
        words = shlex.split(statement)
        stream = "stdout"
        if words and words[-1] == ">&2":
            stream = "stderr"
            words = words[:-1]
        if not words:
            continue
        command, args = words[0], words[1:]
        text = None
        if command == "echo":
            text = " ".join(args) + "\n"
        elif command == "env":
            text = "".join(f"{key}={value}\n" for key, value in env.items())
        elif command == "printf":
            text = args[0].encode().decode("unicode_escape") if args else ""
        elif command == "sleep":
            await asyncio.sleep(float(args[0]))
        elif command == "exit":
            return int(args[0]) if args else status
        elif command in ("true", "false"):
            status = 0 if command == "true" else 1
            continue
        else:
            text, stream, status = f"sh: {command}: not found\n", "stderr", 127
            chunks.append((stream, text))
            if on_output:
                on_output(OutputChunk(stream=stream, text=text))
            continue
        status = 0
        if text:
            chunks.append((stream, text))
            if on_output:
                on_output(OutputChunk(stream=stream, text=text))
    return status
