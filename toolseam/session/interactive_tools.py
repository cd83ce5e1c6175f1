"""Two optional model tools for interactive processes, shaped like codex's: ``exec_command``
starts a command on a terminal and returns what it printed within a yield window — and, if it
is still running, a session id — and ``write_stdin`` types into that session and returns what
came next. Off by default: ``Toolkit(..., interactive_tools=True)`` adds them (a host tool of
the same name wins). They run on ``tools.sandbox.pty_*`` (``interactive.py``): the session's
environment, limits and guards, at most 64 running, all ended with the session.

What the model reads goes through the model-text budget (``model_text.py``): the output is
cut to ``max_output_tokens`` (about 4 characters a token) or the session's
``model_output_chars``, whichever is smaller, head and tail kept, and the process's state is a
note after it, which no cut hides.
"""

from __future__ import annotations

import posixpath
import time
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..builtins import ToolResult
from ..seam.errors import CouldNotRunError, FileOpError
from ..seam.interactive import (
    InteractiveLimitError,
    InteractiveUnsupportedError,
    ProcessExitedError,
    UnknownProcessError,
)
from ..seam.models import PathRef
from .interactive import InteractiveSandbox
from .toolkit_view import ToolkitView


class PtySession(ToolkitView, Protocol):
    """The session the two tools type into: its raw sandbox's terminals (``Toolkit``)."""

    @property
    def sandbox(self) -> InteractiveSandbox: ...


CHARS_PER_TOKEN = 4
MAX_YIELD_MS = 300_000
_READ_BYTES = 1 << 20


class ExecCommandInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cmd: str = Field(min_length=1, description="The shell command to run on a new terminal.")
    workdir: str | None = Field(default=None, description="Its working directory (default: "
                                "the session's base directory).")
    yield_time_ms: int = Field(default=10_000, ge=0, le=MAX_YIELD_MS, description="How long "
                               "to collect output before returning, unless it exits first.")
    max_output_tokens: int | None = Field(default=None, gt=0, description="The most output "
                                          "to return, in tokens (about 4 characters each).")


class WriteStdinInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: int = Field(description="The session id exec_command returned.")
    chars: str = Field(default="", description="What to type (\\n is Enter, \\u0003 Ctrl-C, "
                       "\\u0004 Ctrl-D); empty just waits for more output.")
    yield_time_ms: int = Field(default=250, ge=0, le=MAX_YIELD_MS, description="How long to "
                               "collect output before returning, unless it exits first.")
    max_output_tokens: int | None = Field(default=None, gt=0, description="The most output "
                                          "to return, in tokens (about 4 characters each).")


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


class _PtyTool:
    name = ""
    description = ""
    input_model: type[BaseModel] = BaseModel

    def __init__(self, toolkit: PtySession) -> None:
        self._tk = toolkit
        self.input_schema = _schema(self.input_model)

    async def execute(self, args: dict[str, Any]) -> ToolResult:
        try:
            given = self.input_model.model_validate(args)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: "
                                 f"{e['msg']}" for e in exc.errors())
            return ToolResult(output=f"{self.name}: invalid arguments: {problems}", is_error=True)
        try:
            return await self._run(given)
        except (UnknownProcessError, ProcessExitedError, InteractiveLimitError,
                InteractiveUnsupportedError, FileNotFoundError, ValueError) as exc:
            return ToolResult(output=f"{self.name}: {exc}", is_error=True,
                              metadata={"error": getattr(exc, "code", type(exc).__name__)})
        except (CouldNotRunError, FileOpError) as exc:
            return ToolResult(output=f"{self.name}: could not run: {exc}", is_error=True,
                              metadata={"failure": "could_not_run"})

    async def _run(self, given: Any) -> ToolResult:
        raise NotImplementedError

    async def _collect(self, session: int, yield_ms: int, max_tokens: int | None,
                       began: float) -> ToolResult:
        """Output until the window ends or the process does (codex's yield semantics)."""
        sandbox = self._tk.sandbox
        deadline = began + yield_ms / 1000
        output = bytearray()
        dropped = 0
        exit_code: int | None = None
        exited = False
        while True:
            remaining = max(0, int((deadline - time.monotonic()) * 1000))
            got = await sandbox.pty_read(session, yield_ms=remaining, max_bytes=_READ_BYTES)
            output += got.data
            dropped += got.truncated_bytes
            if got.exited:
                exited, exit_code = True, got.exit_code
                break
            if remaining == 0:
                break
        text = output.decode("utf-8", "replace").replace("\r\n", "\n")
        wall = time.monotonic() - began
        result = ToolResult(output=text, metadata={
            "session_id": None if exited else session, "exit_code": exit_code,
            "wall_time_ms": int(wall * 1000), "dropped_bytes": dropped})
        hints = result.model_hints
        budget = self._tk.settings.model_output_chars
        if max_tokens is not None:
            budget = min(budget, max_tokens * CHARS_PER_TOKEN)
        hints.budget = budget
        if dropped:
            hints.notes.append(f"({dropped:,} bytes of earlier output were dropped: the "
                               "sandbox keeps the newest 1 MiB not yet read)")
        if exited:
            hints.notes.append(f"(process exited with code {exit_code}; wall time {wall:.1f} s)")
        else:
            hints.notes.append(f"(process running with session ID {session}; wall time "
                               f"{wall:.1f} s: write_stdin with this session_id to type into it "
                               "or to read more)")
        return result


class ExecCommand(_PtyTool):
    name = "exec_command"
    description = ("Run a shell command on a terminal in the sandbox. Returns its output within "
                   "yield_time_ms; if it is still running (a REPL, a server, a prompt), also a "
                   "session ID to use with write_stdin. At most 64 run at once.")
    input_model = ExecCommandInput

    def __init__(self, toolkit: PtySession) -> None:
        super().__init__(toolkit)
        self._shell: str | None = None

    async def _run(self, given: Any) -> ToolResult:
        began = time.monotonic()
        tk = self._tk
        await tk.open()
        if given.workdir is not None and tk.confine:  # as bash's workdir: inside the base dir
            where = posixpath.normpath(posixpath.join(tk.base_dir, given.workdir))
            if where != tk.base_dir and not where.startswith(tk.base_dir.rstrip("/") + "/"):
                raise ValueError(f"workdir {given.workdir} is outside the base directory")
        session = await tk.sandbox.pty_start([await self._the_shell(), "-c", given.cmd],
                                             cwd=given.workdir)
        return await self._collect(session, given.yield_time_ms, given.max_output_tokens, began)

    async def _the_shell(self) -> str:
        """bash where the sandbox has it (models write bash), else sh."""
        if self._shell is None:
            found = await self._tk.backend.stat(PathRef(base="/", path="/bin/bash",
                                                        confine=False))
            self._shell = "/bin/bash" if found.kind == "file" and found.executable else "/bin/sh"
        return self._shell


class WriteStdin(_PtyTool):
    name = "write_stdin"
    description = ("Type characters into a running exec_command session (\\n is Enter, "
                   "\\u0003 Ctrl-C) and return the output that follows within yield_time_ms.")
    input_model = WriteStdinInput

    async def _run(self, given: Any) -> ToolResult:
        began = time.monotonic()
        if given.chars:
            await self._tk.sandbox.pty_write(given.session_id, given.chars)
        return await self._collect(given.session_id, given.yield_time_ms,
                                   given.max_output_tokens, began)


def interactive_tools(toolkit: PtySession) -> dict[str, _PtyTool]:
    """The two tools bound to ``toolkit``, by name."""
    return {tool.name: tool for tool in (ExecCommand(toolkit), WriteStdin(toolkit))}


__all__ = ["ExecCommand", "ExecCommandInput", "WriteStdin", "WriteStdinInput",
           "interactive_tools"]
