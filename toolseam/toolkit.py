"""``Toolkit``: one session — a backend, a base dir, the enabled tools, and the policies.

A host builds one per agent run (or workflow step), calls tools by name, ends turns, and closes
it. Everything the host decides is checked here, at construction or at open, and a mistake is a
``HostError``; everything the model does wrong comes back as a tool result.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import posixpath
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .backends import create_backend
from .builtins import BUILTIN_NAMES, CallContext, OutputEvent, ToolResult, all_builtins
from .builtins._base import could_not_run_result
from .declarations import Format, declare
from .policy.environment import CONTAINER_BASE_ENV, command_environment
from .policy.jobs import JobRegistry
from .policy.readscope import Approver, ReadScope
from .policy.settings import Settings
from .policy.shells import ShellChoice, ShellResolver, check_pin
from .seam.errors import (
    ConfigurationError,
    CouldNotRunError,
    HostError,
    SessionClosedError,
    ShellChangedError,
    UnknownToolError,
)
from .seam.models import PathRef, SandboxInfo
from .seam.protocol import BuiltinExec


@runtime_checkable
class HostTool(Protocol):
    """A tool the host brings; one with a builtin's name shadows that builtin."""

    name: str
    description: str
    input_schema: dict[str, Any]

    async def execute(self, args: dict[str, Any]) -> ToolResult: ...


class SessionServices:
    """What the builtins ask of the session: shell, environment, settings, jobs, read scope."""

    def __init__(self, toolkit: Toolkit, backend: BuiltinExec, settings: Settings,
                 raise_could_not_run: bool) -> None:
        self._toolkit = toolkit
        self.settings = settings
        self.raise_could_not_run = raise_could_not_run
        self.jobs = JobRegistry(backend, settings.max_jobs)
        self.command_env: dict[str, str] = {}
        self.read_scope: ReadScope | None = None
        self._shell: ShellChoice | None = None
        self._pinned: ShellChoice | None = None
        self._resolver: ShellResolver | None = None
        self._job_ids = itertools.count(1)
        self._files_read: set[str] = set()

    def note_read(self, absolute_path: str) -> None:
        """The model has seen this file's content (read, edit, write): a guarded write may
        replace it."""
        self._files_read.add(absolute_path)

    def has_read(self, absolute_path: str) -> bool:
        return absolute_path in self._files_read

    @property
    def shell(self) -> ShellChoice:
        if self._shell is None:
            raise ConfigurationError("bash is disabled or the session is not open")
        return self._shell

    def new_backend_job_id(self) -> str:
        return f"{self._toolkit.session_id}-{next(self._job_ids)}"

    def timeout_problem(self, timeout_ms: int) -> str | None:
        bounds = self.settings.timeout_range_ms
        if bounds is not None and not bounds[0] <= timeout_ms <= bounds[1]:
            return f"timeout {timeout_ms}ms is outside the accepted range {bounds[0]}-{bounds[1]}ms"
        return None

    async def start_shells(self, resolver: ShellResolver) -> None:
        """Resolve the session's shell once, at open (ShellNotFound / UnknownShellError)."""
        self._resolver = resolver
        self._shell = await self.resolve_shell()

    async def pin_shell(self) -> ShellChoice:
        fresh = await self.resolve_shell()
        self._shell = self._pinned = fresh
        return fresh

    def unpin_shell(self) -> None:
        self._pinned = None

    async def resolve_shell(self) -> ShellChoice:
        assert self._resolver is not None
        s = self.settings
        return await self._resolver.resolve(s.shell, s.shell_id, self._toolkit.shell_id_persisted)

    async def shell_for_spawn(self) -> ShellChoice:
        """The shell for this spawn; with a pin, re-resolved and compared (COMMAND_SHELL_CHANGED)."""
        if self._pinned is None:
            return self.shell
        try:
            fresh = await self.resolve_shell()
        except HostError as exc:  # the pinned shell stopped resolving: it changed, nothing runs
            raise ShellChangedError(f"the shell pinned for this turn ({self._pinned.label!r}) "
                                    f"no longer resolves: {exc}") from None
        check_pin(self._pinned, fresh)
        return fresh

    async def check_read(self, tool: str, path: str) -> None:
        if self.read_scope is not None:
            await self.read_scope.check(tool, path)

    async def check_command(self, command: str, cwd: str) -> None:
        if self.read_scope is not None:
            await self.read_scope.check_command(command, cwd)


class Toolkit:
    def __init__(
        self,
        backend: BuiltinExec | str = "host",
        *,
        base_dir: str | None = None,
        confine_to_base_dir: bool = False,
        settings: Settings | None = None,
        tools: Mapping[str, bool] | None = None,
        host_tools: Sequence[HostTool] = (),
        raise_could_not_run: bool = False,
        env: Mapping[str, str] | None = None,
        env_extra: Mapping[str, str] | None = None,
        on_output: Callable[[OutputEvent], None] | None = None,
        session_id: str | None = None,
        approver: Approver | None = None,
        shell_id_persisted: bool = False,
        backend_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.settings = settings or Settings()
        if confine_to_base_dir and not base_dir:
            raise ConfigurationError("confine_to_base_dir needs a base_dir")
        unknown = sorted(set(tools or {}) - set(BUILTIN_NAMES))
        if unknown:
            raise ConfigurationError(f"tools: unknown builtin(s) {', '.join(unknown)}; "
                                     f"known: {', '.join(BUILTIN_NAMES)}")
        self.session_id = session_id or uuid.uuid4().hex[:8]
        self.confine = confine_to_base_dir
        self.shell_id_persisted = shell_id_persisted
        limits = self.settings.limits
        if isinstance(backend, str):
            options = dict(backend_options or {})
            if backend == "host" and base_dir:
                options.setdefault("workspace", base_dir)
            if backend != "host":
                options.setdefault("limits", limits)
            elif not limits.is_default:
                raise ConfigurationError("limits (memory, cpus, pids, network, tmpfs_size) are "
                                         "enforced by a container engine; the host backend has none")
            backend = create_backend(backend, **options)
        self.backend: BuiltinExec = backend
        self._base_dir_option = base_dir
        self._env_source = env
        self._env_extra = dict(env_extra or {})
        self.on_output = on_output
        self.approver = approver
        builtins = all_builtins()
        enabled = {name: tool for name, tool in builtins.items() if (tools or {}).get(name, True)}
        self._builtins = enabled
        self._host_tools = {tool.name: tool for tool in host_tools}
        self.services = SessionServices(self, backend, self.settings, raise_could_not_run)
        self.base_dir = ""
        self.info: SandboxInfo | None = None
        self._call_ids = itertools.count(1)
        self._user_messages: list[str] = []
        self._closed = False

    # --- lifecycle ----------------------------------------------------------------------
    async def open(self) -> SandboxInfo:
        """Start the backend, fix the base dir, resolve the shell. Idempotent."""
        if self._closed:
            raise SessionClosedError("the toolkit was closed")
        if self.info is not None:
            return self.info
        info = await self.backend.open()
        base = self._base_dir_option or info.workspace
        if info.backend == "host":
            base = os.path.abspath(base)
        elif not base.startswith("/"):
            base = posixpath.join(info.workspace, base)
        self.base_dir = base
        source = self._env_source
        if source is None:
            source = os.environ if info.backend == "host" else CONTAINER_BASE_ENV
        self.services.command_env = command_environment(source, self.settings.env_allow,
                                                        self._env_extra)
        if self.settings.read_scope is not None:
            scope = ReadScope(self.settings.read_scope, base, self.approver, self.backend,
                              home=self.services.command_env.get("HOME"),
                              local=info.backend == "host")
            scope.set_user_messages(self._user_messages)
            self.services.read_scope = scope
        if "bash" in self._builtins and "bash" not in self._host_tools:
            await self.services.start_shells(ShellResolver(
                info.platform, self._executable_exists, self.services.command_env))
        self.info = info
        return info

    async def _executable_exists(self, path: str) -> bool:
        found = await self.backend.stat(PathRef(base="/", path=path, confine=False))
        return found.kind == "file" and found.executable

    async def close(self) -> None:
        """Kill every job and close the backend: no process of this session is left."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.info is not None:
                await self.services.jobs.close()
        finally:
            await self.backend.close()

    async def __aenter__(self) -> Toolkit:
        await self.open()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # --- turns --------------------------------------------------------------------------
    async def pin_shell(self) -> ShellChoice:
        """Resolve the shell afresh (a persisted id may fall back now) and pin it for this turn:
        if the resolution changes before a spawn, that call fails with COMMAND_SHELL_CHANGED."""
        await self.open()
        return await self.services.pin_shell()

    async def end_turn(self) -> list[int]:
        """End the turn: un-kept jobs die, the shell pin is released. Returns killed job ids."""
        self.services.unpin_shell()
        if self.info is None:
            return []
        return [job.id for job in await self.services.jobs.end_turn()]

    def user_message(self, text: str) -> None:
        """Feed a USER message (never model output): paths it names widen the read scope."""
        self._user_messages.append(text)
        if self.services.read_scope is not None:
            self.services.read_scope.add_user_message(text)

    # --- calls --------------------------------------------------------------------------
    @property
    def tool_names(self) -> list[str]:
        names = [n for n in BUILTIN_NAMES if n in self._builtins or n in self._host_tools]
        return names + [n for n in self._host_tools if n not in names]

    async def call(self, name: str, args: Any, *, call_id: str | None = None,
                   on_output: Callable[[OutputEvent], None] | None = None) -> ToolResult:
        """Run one tool call. Tool failures are results; host mistakes raise HostError."""
        if self._closed:
            raise SessionClosedError("the toolkit was closed")
        host_tool = self._host_tools.get(name)
        if host_tool is not None:
            return await host_tool.execute(args)
        tool = self._builtins.get(name)
        if tool is None:
            raise UnknownToolError(f"unknown tool {name!r}; enabled: {', '.join(self.tool_names)}")
        try:
            if self.info is None:
                await self.open()
        except CouldNotRunError as exc:  # fail closed, but as a result the model can read
            if self.services.raise_could_not_run:
                raise
            return could_not_run_result(name, exc)
        ctx = CallContext(self.backend, self.base_dir, self.confine, self.session_id,
                          call_id or f"call-{next(self._call_ids)}", self.services,
                          on_output or self.on_output)
        return await tool(args, ctx)

    async def call_stream(self, name: str, args: Any, *, call_id: str | None = None
                          ) -> AsyncIterator[OutputEvent | ToolResult]:
        """The same call as an async iterator: live ``OutputEvent``s in arrival order, then the
        final ``ToolResult`` as the last item. Closing the iterator early cancels the call
        (and so kills its command inside the sandbox)."""
        queue: asyncio.Queue[OutputEvent | ToolResult | BaseException] = asyncio.Queue()

        async def run() -> None:
            try:
                await queue.put(await self.call(name, args, call_id=call_id,
                                                on_output=queue.put_nowait))
            except Exception as exc:  # noqa: BLE001 - handed to the consumer, raised there
                await queue.put(exc)

        task = asyncio.ensure_future(run())
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, ToolResult):
                    return
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def declarations(self, fmt: Format) -> list[dict[str, Any]]:
        """Tool declarations for a provider: ``openai``, ``openai-strict``, ``responses``,
        ``anthropic`` or ``gemini``."""
        out = []
        for name in self.tool_names:
            host_tool = self._host_tools.get(name)
            if host_tool is not None:
                out.append(declare(name, host_tool.description, host_tool.input_schema, fmt))
            else:
                tool = self._builtins[name]
                out.append(declare(name, tool.description, tool.input_schema(self.services), fmt))
        return out
