"""The raw sandbox API of a session (``Toolkit.sandbox``): run an argv, move whole files.

What a harness (inspect_ai's ``SandboxEnvironment``) or a workflow step needs below the model's
tools: a command as an argv — never parsed by a shell — with stdin, a working directory,
environment additions, a user, a timeout that kills the whole job and a per-stream output limit;
and the bytes of whole files in and out.

It goes through the same seam, job tracking and limits as the bash tool: the job runs under the
session's agent (a deadline the sandbox itself enforces, the whole-job kill, the head + tail
output capture), with the session's command environment (``env`` adds to it), inside the
session's container limits and network policy. Stdin is written to a file in the sandbox's
``/tmp`` first (the job reads it from there; the agent unlinks it as soon as the job holds it).

Errors are Python's own where one fits: ``FileNotFoundError``, ``PermissionError``,
``IsADirectoryError``, ``NotADirectoryError``; a file above the read limit is
``FileLimitError``. A user the sandbox cannot switch to is ``UserUnsupportedError``, one it does
not know ``UnknownUserError``. A program that is not there is an ordinary result (exit code
127, a message on stderr), as a shell or an engine's exec gives it; one that is there but cannot
be executed is ``PermissionError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import posixpath
import secrets
import shutil
import tempfile
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from ..seam.capabilities import ExposedPort
from ..seam.errors import CouldNotRunError, FileOpError, HostError, ToolseamError
from ..seam.models import MAX_MS, ChangeSet, DeleteOp, PathRef
from ..seam.protocol import ExecRequest
from . import ports
from .interactive import InteractiveSandbox, PtyOutput
from .path_sides import missing_in_sandbox_hint, side
from .raw_checks import checked_argv, checked_env, os_error
from .toolkit_view import ToolkitView

_USER_UNKNOWN, _USER_UNSUPPORTED = "user-unknown:", "user-unsupported:"  # toolseam_agent/spawn_as.py
_SPAWN_FAILED = "could not start the command:"  # agentlink/errors.py's reason for a spawn error
NOT_FOUND_EXIT = 127  # what a shell answers for a program that is not there


class UserUnsupportedError(HostError):
    """The sandbox cannot run commands as another user (a container drops every capability;
    a host agent not running as root cannot switch)."""

    code = "USER_UNSUPPORTED"


class UnknownUserError(HostError):
    """The sandbox has no such user (its own ``/etc/passwd`` decides)."""

    code = "UNKNOWN_USER"


class FileLimitError(ToolseamError):
    """A file is larger than the read limit; nothing was read."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(f"{path} is {size} bytes, above the read limit of {limit} bytes")
        self.path, self.size, self.limit = path, size, limit


class ExecResult(BaseModel):
    """How a command ended and what it wrote (UTF-8, an invalid byte as U+FFFD)."""

    model_config = ConfigDict(frozen=True)

    argv: list[str]
    exit_code: int | None = Field(description="The exit status; None when a signal ended it.")
    signal: int | None = Field(description="The signal that ended it (9 after a timeout's kill).")
    stdout: str = Field(description="Kept stdout: all of it, or its head and tail when truncated.")
    stderr: str
    stdout_bytes: int = Field(description="Bytes the command wrote to stdout in all.")
    stderr_bytes: int
    stdout_truncated: bool = Field(description="The middle of stdout was dropped (output_limit).")
    stderr_truncated: bool
    timed_out: bool = Field(description="The timeout elapsed and the whole job was killed.")
    oom_killed: bool = False
    duration_ms: int

    @property
    def success(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class RawSandbox(InteractiveSandbox):
    """The session's sandbox, raw. Relative paths (and ``cwd``) are against the base dir.
    Interactive processes (``pty_*``) are in ``interactive.py``."""

    def __init__(self, toolkit: ToolkitView) -> None:
        self._tk = toolkit

    async def exec(self, argv: Sequence[str], *, stdin: bytes | str | None = None,
                   cwd: str | None = None, env: Mapping[str, str] | None = None,
                   user: str | int | None = None, timeout: float | None = None,
                   output_limit: int | None = None, keep_detached: bool = False) -> ExecResult:
        """Run ``argv`` (``argv[0]`` found through ``PATH`` as the command sees it).

        ``timeout`` (seconds) kills the whole job — everything it started — when it elapses:
        the result has ``timed_out``. ``output_limit`` is the bytes kept per stream (default:
        the settings' ``output_limit_bytes``); above it the middle is dropped.
        ``keep_detached``: what the command leaves running outlives it — background jobs when
        it ends (the call returns once the command exits and a short drain is over), and at a
        timeout or cancellation the processes it moved into a session of their own
        (``setsid``); the session's close ends them all. Without it, the command's end ends
        everything it started.

        Raises:
            ValueError: a malformed argument (empty argv, a NUL, a bad timeout).
            FileNotFoundError: ``cwd`` does not exist.
            PermissionError: ``argv[0]`` exists but cannot be executed.
            UserUnsupportedError / UnknownUserError: ``user`` cannot be used here.
            CouldNotRunError: the sandbox failed (not the command).
        """
        args = checked_argv(argv)
        extra = checked_env(env)
        if timeout is not None and not 0 < timeout * 1000 <= MAX_MS:
            raise ValueError(f"timeout must be more than 0 and at most {MAX_MS // 1000} s, "
                             f"got {timeout}")
        tk = self._tk
        await tk.open()
        settings = tk.services.settings
        workdir = self._absolute(cwd or ".")
        job = tk.services.new_backend_job_id()
        stdin_file = private_dir = None
        if stdin is not None:
            stdin_file, private_dir = self._stdin_path(job)
            data = stdin.encode() if isinstance(stdin, str) else bytes(stdin)
            await tk.backend.write(PathRef(base="/", path=stdin_file), data)
        request = ExecRequest(
            job=job, argv=args, cwd=workdir, env={**tk.services.command_env, **extra},
            deadline_ms=None if timeout is None else max(1, int(timeout * 1000)),
            grace_ms=settings.kill_grace_ms, output_limit=output_limit or settings.output_limit_bytes,
            forget_when_done=True, stdin_file=stdin_file,
            user=None if user is None else str(user), env_given=sorted(extra),
            keep_detached=keep_detached)
        try:
            status = await tk.backend.start(request)
        except asyncio.CancelledError:  # cancelling the call kills the command in the sandbox
            await asyncio.shield(self._abandon(job))
            raise
        except FileOpError as exc:
            if exc.code == "not_found":
                info = tk.info
                raise FileNotFoundError(
                    errno.ENOENT, f"working directory does not exist {side(info)}"
                    f"{missing_in_sandbox_hint(info, cwd, 'cwd') if cwd else ''}",
                    cwd or workdir) from None
            raise
        except CouldNotRunError as exc:
            if stdin_file is not None:  # the agent removes it once spawned; not when it refused
                await self._remove(stdin_file)
            return await self._spawn_failed(exc, args, workdir, request.env)
        finally:
            if private_dir is not None:  # the agent unlinked the file once the job had it
                shutil.rmtree(private_dir, ignore_errors=True)
        stdout = "".join(c.text for c in status.chunks if c.stream == "stdout")
        stderr = "".join(c.text for c in status.chunks if c.stream == "stderr")
        code = status.exit_code
        return ExecResult(
            argv=args, exit_code=code if code is None or code >= 0 else None,
            signal=-code if code is not None and code < 0 else None, stdout=stdout, stderr=stderr,
            stdout_bytes=status.stdout_bytes, stderr_bytes=status.stderr_bytes,
            stdout_truncated=status.stdout_truncated, stderr_truncated=status.stderr_truncated,
            timed_out=status.timed_out, oom_killed=status.oom_killed,
            duration_ms=status.duration_ms)

    async def read_bytes(self, path: str, *, limit: int | None = None) -> bytes:
        """The whole file. ``limit`` (default: the settings' ``read_max_bytes``): a larger
        file raises ``FileLimitError`` without being read.

        Raises: FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
        FileLimitError, CouldNotRunError.
        """
        await self._tk.open()
        cap = limit if limit is not None else self._tk.services.settings.read_max_bytes
        try:
            content = await self._tk.backend.read_bytes(self._ref(path), refuse_above_bytes=cap)
        except FileOpError as exc:
            if exc.code == "too_large":
                raise FileLimitError(path, int(exc.detail or 0), cap) from None
            raise os_error(exc, path) from None
        return content.data

    async def write_bytes(self, path: str, data: bytes | str) -> None:
        """Write the whole file (text as UTF-8), atomically; missing parents are created, an
        existing file keeps its mode.

        Raises: PermissionError (including a file whose mode is read-only), IsADirectoryError,
        NotADirectoryError, CouldNotRunError.
        """
        await self._tk.open()
        payload = data.encode() if isinstance(data, str) else bytes(data)
        try:
            await self._tk.backend.write(self._ref(path), payload)
        except FileOpError as exc:
            raise os_error(exc, path) from None

    async def expose(self, port: int, host: str = "127.0.0.1", *, host_port: int = 0
                     ) -> ExposedPort:
        """The sandbox's ``127.0.0.1:port``, reachable here at ``result.host:result.port``:
        a tunnel for the session's owner over the session's own channel (``ports.py``), so
        it works with network ``none`` and on a remote engine. The listener is TCP, on
        loopback unless ``host`` says otherwise; ``host_port`` 0 lets the kernel pick. Only the
        owner gets through: each connection is admitted only when the local socket that made
        it belongs to the uid this process runs as (the kernel is asked, as identd would be);
        another user's — root's too, unless root is the owner — or a peer with no socket on
        this machine is closed before a byte is carried. A connection the
        sandbox refuses is closed here at once. ``await result.close()`` ends it; the
        session's end does too.

        Raises:
            ValueError: a port out of range, an empty host.
            OSError: the listener could not be made here (the address is in use, say).
            ConfigurationError: the backend has no channel to carry it (``ExposedPorts``).
            CouldNotRunError: the sandbox failed.
        """
        return await ports.expose(self._tk, port, host, host_port)

    # --- helpers ------------------------------------------------------------------------
    def _ref(self, path: str) -> PathRef:
        if not path or "\0" in path:
            raise ValueError(f"path {path!r} is empty or holds a NUL")
        return PathRef(base=self._tk.base_dir, path=path, confine=self._tk.confine)

    def _absolute(self, path: str) -> str:
        if "\0" in path:
            raise ValueError("cwd must not contain a NUL byte")
        return posixpath.normpath(posixpath.join(self._tk.base_dir, path))

    def _stdin_path(self, job: str) -> tuple[str, str | None]:
        """Where a command's stdin is staged. On this machine (the host backend): in a fresh
        0700 directory, so no other local user can read it or plant a link there; returned
        too, for removal. In a container: its own /tmp (a tmpfs only the sandbox sees)."""
        name = f".toolseam-stdin-{job}-{secrets.token_hex(6)}"
        info = self._tk.info
        if info is not None and info.local:
            private = tempfile.mkdtemp(prefix="toolseam-stdin-")
            return os.path.join(private, name), private
        return posixpath.join("/tmp", name), None

    async def _remove(self, path: str) -> None:
        with contextlib.suppress(FileOpError, CouldNotRunError):
            await self._tk.backend.commit(ChangeSet(base="/", ops=[DeleteOp(path=path)]))

    async def _abandon(self, job: str) -> None:
        with contextlib.suppress(Exception):
            await self._tk.backend.kill(job)
            await self._tk.backend.release(job)

    async def _spawn_failed(self, exc: CouldNotRunError, argv: list[str], cwd: str,
                            env: Mapping[str, str]) -> ExecResult:
        """A spawn error: the user refused, the program missing (a result) or not executable."""
        reason = exc.reason
        if _USER_UNSUPPORTED in reason:
            raise UserUnsupportedError(reason.split(_USER_UNSUPPORTED, 1)[1].strip()) from None
        if _USER_UNKNOWN in reason:
            raise UnknownUserError(reason.split(_USER_UNKNOWN, 1)[1].strip()) from None
        if _SPAWN_FAILED not in reason:  # a Ray node's reason starts with the node's name
            raise exc
        found = await self._find_program(argv[0], cwd, env.get("PATH", os.defpath))
        if found is None:
            message = f"toolseam: {argv[0]}: command not found\n"
            return ExecResult(argv=argv, exit_code=NOT_FOUND_EXIT, signal=None, stdout="",
                              stderr=message, stdout_bytes=0, stderr_bytes=len(message),
                              stdout_truncated=False, stderr_truncated=False, timed_out=False,
                              duration_ms=0)
        if not found:
            raise PermissionError(errno.EACCES, "Permission denied: not an executable file",
                                  argv[0]) from None
        raise exc

    async def _find_program(self, program: str, cwd: str, path: str) -> bool | None:
        """None: nothing there; False: there but not an executable file; True: executable."""
        candidates = ([posixpath.join(cwd, program)] if "/" in program else
                      [posixpath.join(d or ".", program) for d in path.split(":")])
        seen_other = False
        for candidate in candidates:
            found = await self._tk.backend.stat(PathRef(base=cwd, path=candidate))
            if found.kind == "file" and found.executable:
                return True
            if found.kind != "missing":
                seen_other = True
        return False if seen_other else None


__all__ = ["ExecResult", "ExposedPort", "FileLimitError", "PtyOutput", "RawSandbox",
           "UnknownUserError",
           "UserUnsupportedError", "os_error"]
