"""``bash``: run a command through the session's shell; with the detach policy, manage jobs.

Forms (exactly one per call): ``{command, workdir?, timeout?, description?, keep?}``,
``{wait: id, timeout?, keep?}``, ``{kill: id}``, ``{jobs: true}`` — the job forms only when the
host chose the ``detach`` timeout policy.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import signal
import time
from typing import Any

from pydantic import StrictBool, StrictStr, model_validator

from ..model_text import Gap, mark_gaps
from ..policy.jobs import TrackedJob, format_duration
from ..seam.errors import CouldNotRunError, FileOpError
from ..seam.models import JobStatus, OutputChunk, SpawnRequest
from ._base import (
    MAX_TIMEOUT_MS,
    Builtin,
    CallContext,
    InputModel,
    JobId,
    Milliseconds,
    OutputEvent,
    SessionView,
    ToolResult,
    error,
    object_schema,
    ok,
)
from ._spill import spill

_FORMS = ("command", "wait", "kill", "jobs")
_FORM_OPTIONS = {"command": {"workdir", "timeout", "description", "keep"},
                 "wait": {"timeout", "keep"}, "kill": set(), "jobs": set()}


class BashInput(InputModel):
    command: StrictStr | None = None
    workdir: StrictStr | None = None
    timeout: Milliseconds | None = None
    description: StrictStr | None = None
    wait: JobId | None = None
    kill: JobId | None = None
    jobs: StrictBool | None = None
    keep: StrictBool | None = None

    @model_validator(mode="after")
    def _one_form(self) -> BashInput:
        for name in ("command", "workdir"):
            if "\0" in (getattr(self, name) or ""):
                raise ValueError(f"{name} must not contain a NUL byte")
        if self.command is not None and self.wait is None and self.kill is None and not self.jobs:
            return self  # the command form, which takes every option: the common case, fast
        given = [f for f in _FORMS if getattr(self, f) not in (None, False)]
        if len(given) != 1:
            named = ", ".join(given) if given else "none"
            raise ValueError("use exactly one form: {command}, {wait: id}, {kill: id} or "
                             f"{{jobs: true}} (got: {named})")
        form = given[0]
        allowed = _FORM_OPTIONS[form]
        extra = [f for f in ("workdir", "timeout", "description", "keep")
                 if getattr(self, f) is not None and f not in allowed]
        if extra:
            raise ValueError(f"{', '.join(extra)} cannot be used with the {form} form")
        return self


_COMMAND_SCHEMA = object_schema({
    "command": ("string", "The command line to run, in a fresh shell (cd and export do not "
                "carry over from earlier calls: use workdir, or chain with &&)."),
    "workdir": ("string", "Directory to run in; relative paths are against the base dir."),
    "timeout": ("integer", "Kill the command after this many milliseconds (default 60000, "
                "at most 2147483647)."),
    "description": ("string", "A few words on what the command does."),
}, ["command"], bounds={"timeout": (1, MAX_TIMEOUT_MS)})


class Bash(Builtin[BashInput]):
    name = "bash"
    description = (
        "Run a shell command in the workspace and return its output (stdout and stderr "
        "interleaved as they were written). A non-zero exit is reported as an error. Each call "
        "runs in a fresh shell: cd and export do not carry over to the next call — pass workdir "
        "(or chain commands with &&). Timeout: 60000 ms by default unless the host set another; "
        "the timeout parameter names this session's default and maximum. Processes a command "
        "leaves in the background are killed when it ends; where the host allows jobs, "
        "leaving out timeout lets a long command keep running as a job you come back to with "
        "{\"wait\": id}. Output: each stream keeps its first and last 512 KiB; the text you are "
        "shown is held to about 30000 characters (head and tail, the cut marked) and the whole "
        "output is kept in a file the read tool can page.")
    Input = BashInput
    schema = _COMMAND_SCHEMA

    def input_schema(self, services: SessionView | None = None) -> dict[str, Any]:
        if services is None:
            return self.schema
        settings = services.settings
        default = settings.effective_default_timeout_ms
        bounds = settings.timeout_range_ms
        most = bounds[1] if bounds is not None else MAX_TIMEOUT_MS
        least = bounds[0] if bounds is not None else 1
        props = dict(self.schema["properties"])
        detach = settings.timeout_policy == "detach"
        timeout_text = (f"Kill the command after this many milliseconds (at least {least}, at "
                        f"most {most}). " + (
                            f"Left out: wait {default} ms ({format_duration(default)}), then "
                            "leave the command running as a job (its id is in the reply)."
                            if detach and default else
                            "Left out: wait for the command to finish, then run it as a job."
                            if detach else
                            f"Default {default} ms ({format_duration(default)})."))
        props["timeout"] = {**props["timeout"], "description": timeout_text, "minimum": least,
                            "maximum": most}
        if not detach:
            return {**self.schema, "properties": props}
        props.update({
            "wait": {"type": "integer", "minimum": 1, "description": "Keep waiting for a running job by id."},
            "kill": {"type": "integer", "minimum": 1,
                     "description": "Stop a running job (and all it started) by id."},
            "jobs": {"type": "boolean", "description": "List this session's jobs."},
            "keep": {"type": "boolean", "description": "Keep the job alive past the end of the turn."},
        })
        # Each form requires a different key, so the schema itself requires none.
        return {"type": "object", "properties": props, "additionalProperties": False}

    async def run(self, args: BashInput, ctx: CallContext) -> ToolResult:
        if args.command is None and ctx.services.settings.timeout_policy != "detach":
            return error("bash: the wait, kill and jobs forms need the detach timeout policy")
        if args.command is not None:
            return await self._command(args, ctx)
        if args.jobs:
            return await self._list(ctx)
        job_id = args.wait if args.wait is not None else args.kill
        assert job_id is not None
        job = ctx.services.jobs.get(job_id)
        if job is None:
            return error(f"bash: no job {job_id}; {{\"jobs\": true}} lists this session's jobs")
        if args.kill is not None:
            return await self._kill(job, ctx)
        return await self._wait(job, args, ctx)

    async def _command(self, args: BashInput, ctx: CallContext) -> ToolResult:
        services = ctx.services
        settings = services.settings
        assert args.command is not None
        if args.timeout is not None:
            problem = services.timeout_problem(args.timeout)
            if problem:
                return error(f"bash: {problem}")
        shell = await services.shell_for_spawn()
        cwd = ctx.base_dir if args.workdir is None else await _workdir(args.workdir, ctx)
        await services.check_command(args.command, cwd)
        detach = args.timeout is None and settings.timeout_policy == "detach"
        timeout_ms = args.timeout if args.timeout is not None else settings.effective_default_timeout_ms
        request = SpawnRequest(  # pydantic-core checks this faster than model_construct builds it
            job=services.new_backend_job_id(), argv=[*shell.argv, args.command], cwd=cwd,
            env=services.command_env, deadline_ms=settings.job_max_ms if detach else timeout_ms,
            grace_ms=settings.kill_grace_ms,
            wait_ms=(timeout_ms or None) if detach else None,
            stream=ctx.on_output is not None, output_limit=settings.output_limit_bytes,
            forget_when_done=True)
        status = await _start(request, ctx)
        meta: dict[str, Any] = {"shell": shell.label}
        if shell.id is not None:
            meta["shellId"] = shell.id
        if shell.fallback:
            meta["shellFallback"] = True
        if status.state == "running":
            job, evicted = await services.jobs.adopt(status, args.command, bool(args.keep))
            return await _for_model(
                _still_running(job, status, timeout_ms, meta, evicted, services.jobs.max_jobs),
                status, ctx)
        # finished: the sandbox already forgot it
        return await _for_model(shape_result(status, timeout_ms, meta), status, ctx, timeout_ms)

    async def _wait(self, job: TrackedJob, args: BashInput, ctx: CallContext) -> ToolResult:
        services = ctx.services
        if args.keep:
            job.keep = True
        wait_ms = args.timeout if args.timeout is not None else services.settings.effective_default_timeout_ms
        # A cancelled wait propagates and leaves the job running: only the wait was abandoned.
        status = await ctx.backend.wait(job.backend_job, wait_ms or None)
        services.jobs.mark(job, status)
        meta: dict[str, Any] = {"shell": services.shell.label, "jobId": job.id}
        if status.state == "running":
            return await _for_model(
                _still_running(job, status, int((time.time() - job.started) * 1000), meta, None,
                               services.jobs.max_jobs), status, ctx)
        return await _for_model(shape_result(status, services.settings.job_max_ms, meta), status,
                                ctx, services.settings.job_max_ms)

    async def _kill(self, job: TrackedJob, ctx: CallContext) -> ToolResult:
        was_running = job.state == "running"
        status = await ctx.services.jobs.kill(job)
        if status is None:
            return error(f"bash: job {job.id} could not be reached to kill it", jobId=job.id)
        meta = {"jobId": job.id, "killed": status.killed, "killedTree": status.killed_tree,
                **_stream_meta(status)}
        if not status.killed:
            head = f"job {job.id} had already ended (exit code {status.exit_code})"
        else:
            head = f"killed job {job.id}" + ("" if was_running else " (it had already ended)")
        return await _for_model(ok(f"{head}\n{status.output}", **meta), status, ctx)

    async def _list(self, ctx: CallContext) -> ToolResult:
        registry = ctx.services.jobs
        await registry.refresh()
        rows = [f"{j.id}\t{j.state}\tstarted {time.strftime('%H:%M:%S', time.localtime(j.started))}"
                f"\t{'kept' if j.keep else 'turn'}\t{_head(j.command)}" for j in registry.all()]
        jobs = [{"id": j.id, "state": j.state, "started": j.started, "keep": j.keep,
                 "command": _head(j.command)} for j in registry.all()]
        return ok("\n".join(rows) if rows else "no jobs", jobs=jobs)


async def _workdir(workdir: str | None, ctx: CallContext) -> str:
    if workdir is None:
        return ctx.base_dir
    found = await ctx.backend.stat(ctx.ref(workdir))
    if found.kind == "missing":
        raise FileOpError("not_found", workdir)
    if found.kind != "dir":
        raise FileOpError("not_directory", workdir)
    return ctx.absolute(workdir) if not workdir.startswith("/") else posixpath.normpath(workdir)


async def _start(request: SpawnRequest, ctx: CallContext) -> JobStatus:
    callback = None
    if ctx.on_output is not None:
        sink = ctx.on_output

        def callback(chunk: OutputChunk) -> None:
            sink(OutputEvent(ctx.session_id, ctx.call_id, chunk.stream, chunk.text))

    try:
        return await ctx.backend.start(request, callback)
    except asyncio.CancelledError:
        # Cancelling the call cancels the command: the kill happens inside the sandbox.
        await asyncio.shield(_abandon(ctx, request.job))
        raise


async def _abandon(ctx: CallContext, job: str) -> None:
    with contextlib.suppress(CouldNotRunError, Exception):
        await ctx.backend.kill(job)
        await ctx.backend.release(job)


def _stream_meta(status: JobStatus) -> dict[str, Any]:
    return {"stdoutBytes": status.stdout_bytes, "stderrBytes": status.stderr_bytes,
            "stdoutTruncated": status.stdout_truncated, "stderrTruncated": status.stderr_truncated}


def shape_result(status: JobStatus, timeout_ms: int, meta: dict[str, Any]) -> ToolResult:
    """The byte-exact bash output of CONTRACT §3 for a finished job."""
    out = status.output
    meta = {**meta, "timedOut": status.timed_out, **_stream_meta(status),
            "durationMs": status.duration_ms}
    if status.leftovers_killed:
        meta["leftoversKilled"] = status.leftovers_killed
    if status.oom_killed:
        meta["oomKilled"] = True
    if status.timed_out or status.killed:
        meta["killedTree"] = status.killed_tree is True
    if status.timed_out:
        return error(f"bash: command timed out after {timeout_ms}ms\n{out}", **meta)
    meta["exitCode"] = status.exit_code
    if status.exit_code != 0:
        return error(f"{out}\nbash: command exited with code {status.exit_code}", **meta)
    return ok(out, **meta)


async def _for_model(result: ToolResult, status: JobStatus, ctx: CallContext,
                     timeout_ms: int | None = None) -> ToolResult:
    """What the model is told beyond ``output``: where the capture dropped text, what ended the
    command, and — when the text must be cut to the budget — a spill file with all of it."""
    ctx.note_job(status)
    hints = result.model_hints
    hints.budget = ctx.services.settings.model_output_chars
    out = status.output
    shift = result.output.find(out) if out else 0  # after a "timed out" / "still running" line
    hints.gaps = [Gap(shift + g.at, g.stream, g.bytes, g.lines, g.line_start) for g in status.gaps]
    if status.stdout_truncated or status.stderr_truncated:
        hints.total_bytes = status.stdout_bytes + status.stderr_bytes
        if status.stdout_lines is not None and status.stderr_lines is not None:
            hints.total_lines = status.stdout_lines + status.stderr_lines
    hints.notes.extend(_status_notes(status, ctx.services, timeout_ms))
    if not result.output.strip() and status.state == "exited" and not status.timed_out:
        hints.notes.insert(0, "(no output)")
    body, _ = mark_gaps(result.output, hints.gaps)
    if len(body) + sum(len(n) + 1 for n in hints.notes) > hints.budget:
        hints.spill = await spill(ctx.backend, ctx.services, ctx.session_id, ctx.call_id, body)
        if hints.spill is None:
            hints.more = ("the rest was not kept (the spill file could not be written): narrow "
                          "the output, e.g. with | tail -n 200, | head, or grep")
    return result


def _status_notes(status: JobStatus, services: SessionView, timeout_ms: int | None) -> list[str]:
    """Short sentences on how the command ended that ``output`` does not already say."""
    notes = []
    code = status.exit_code
    ended_by_us = status.timed_out or status.killed  # said below, or asked for
    if status.state == "exited" and code is not None and code < 0 and not ended_by_us:
        notes.append(f"(the command was ended by signal {-code} ({_signal_name(-code)}))")
    elif status.state == "exited" and code is not None and 128 < code <= 128 + 64 \
            and not ended_by_us:
        notes.append(f"(exit code {code} usually means a process was ended by signal "
                     f"{code - 128} ({_signal_name(code - 128)}))")
    if status.timed_out:
        tree = ("it and every process it started were killed" if status.killed_tree
                else "it was killed, but some of its processes could not be")
        advice = f"pass a larger timeout (in ms, at most {_max_timeout(services)})"
        if services.settings.timeout_policy == "detach":
            advice += ", or leave timeout out to get a job id and come back with {\"wait\": id}"
        notes.append(f"(timed out after {timeout_ms} ms: {tree}; {advice})")
    if status.oom_killed:
        notes.append("(the kernel's out-of-memory killer killed a process of this command: the "
                     "sandbox's memory limit was reached)")
    if status.leftovers_killed:
        n = status.leftovers_killed
        notes.append(f"({n} process{'' if n == 1 else 'es'} it left running in the background "
                     f"{'was' if n == 1 else 'were'} killed when it ended: every call owns what it "
                     "starts" + ("; a detached job (leave timeout out) may outlive the call)"
                                 if services.settings.timeout_policy == "detach" else ")"))
    return notes


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _max_timeout(services: SessionView) -> int:
    bounds = services.settings.timeout_range_ms
    return bounds[1] if bounds is not None else MAX_TIMEOUT_MS


def _still_running(job: TrackedJob, status: JobStatus, waited_ms: int, meta: dict[str, Any],
                   evicted: TrackedJob | None, max_jobs: int) -> ToolResult:
    line = (f"still running after {format_duration(waited_ms)} (job {job.id}) — output so far "
            f"below; bash {{\"wait\": {job.id}}} keeps waiting, {{\"kill\": {job.id}}} stops it, "
            "pass timeout for a longer first wait")
    extra: dict[str, Any] = {}
    if evicted is not None:
        line += (f"\nstopped job {evicted.id} ({_head(evicted.command)}): at most {max_jobs} "
                 "jobs run at once")
        extra["evictedJobId"] = evicted.id
    return ok(f"{line}\n{status.output}", **{**meta, "detached": True, "jobId": job.id,
                                            "pid": status.pid, **_stream_meta(status), **extra})


def _head(command: str) -> str:
    first = command.strip().splitlines()[0] if command.strip() else ""
    return first if len(first) <= 60 else first[:57] + "..."
