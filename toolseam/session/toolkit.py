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
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from .. import stdio_wire
from ..backends import backend_for
from ..builtins import (
    BUILTIN_NAMES,
    Builtin,
    CallContext,
    OutputEvent,
    ToolResult,
    all_builtins,
    could_not_run_result,
    remove_spills,
)
from ..observability import SessionObserver, SessionReport
from ..observability.hook import session_step
from ..policy.environment import command_environment
from ..policy.readscope import Approver, ReadScope
from ..policy.session import Session
from ..policy.settings import Settings, parse_settings
from ..policy.shells import ShellChoice, ShellResolver
from ..seam.capabilities import Egress, egress, supports
from ..seam.errors import (
    ConfigurationError,
    CouldNotRunError,
    HostError,
    SessionClosedError,
    UnknownToolError,
)
from ..seam.handle import SessionHandle
from ..seam.models import PathRef, SandboxInfo, SyncReport
from ..seam.protocol import BuiltinExec, WorkspaceTransfer
from . import durable
from .branching import Branches
from .declarations import Format, declare
from .interactive_tools import interactive_tools as pty_tools
from .lifetime import Ephemeral, Lifetime, lifetime_for
from .path_sides import missing_in_sandbox_hint, side
from .raw import RawSandbox

if TYPE_CHECKING:
    from ..backends.snapshots import RestoreResult, Snapshot
    from ..egress.audit import EgressEvent
    from ..egress.session import SessionEgress


def _json_object(text: str | bytes, depth_limit: int) -> Any:
    """A provider's JSON arguments text as the object it holds; other text (too deeply nested,
    NaN or Infinity, not an object) is left as it is, for the builtin to refuse in its own
    words — never a RecursionError out of the call."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    if stdio_wire.deeper_than(raw, depth_limit):
        return text
    try:
        decoded = stdio_wire.loads(raw)
    except (ValueError, RecursionError):
        return text
    return decoded if isinstance(decoded, dict) else text


@runtime_checkable
class HostTool(Protocol):
    """A tool the host brings; one with a builtin's name shadows that builtin."""

    name: str
    description: str
    input_schema: dict[str, Any]

    async def execute(self, args: dict[str, Any]) -> ToolResult: ...


class Toolkit:
    """One session: a backend, a base dir, the enabled tools and the host's policies.

    Use it as ``async with Toolkit(...) as tools:`` (or ``await open()`` … ``await close()``)
    inside ONE event loop: the session's agent channel, jobs and locks belong to the loop that
    opened it. From synchronous code use ``SyncToolkit``, which takes the same parameters.

    Args:
        backend: where the tools run — a name (``"host"``, ``"podman"``, ``"docker"``; a
            missing extra raises ``BackendUnavailable`` naming what to install) or a backend
            instance (``HostBackend``, ``PodmanBackend(...)``, ``DockerBackend(...)``). The host
            backend runs commands on this machine as this user: see ``confine_to_base_dir``.
        base_dir: the directory (a ``str`` or ``pathlib.Path``; ``~`` is expanded on this
            machine) relative paths resolve against and bash starts in. Default:
            the backend's workspace (the current directory for ``"host"``, ``/workspace`` in a
            container; a relative one there is taken under ``/workspace``). Open refuses one
            that does not exist or is not a directory (``ConfigurationError`` naming it).
        confine_to_base_dir: refuse every path of the FILE tools (read, write, edit,
            apply_patch, grep, glob, bash's ``workdir``) that resolves outside ``base_dir``.
            It does not contain what a bash command does: on the host backend a command can
            reach whatever this user can; a container backend is the boundary for commands.
        settings: the host's policies — a ``Settings``, or a mapping of the same fields
            (validated like a settings file; a bad field raises ``ConfigurationError``).
            Default: ``Settings()``.
        tools: builtins to switch on or off by name, e.g. ``{"bash": False}``; unnamed ones
            stay on; an unknown name raises ``ConfigurationError``.
        host_tools: tools the host brings (objects with ``name``, ``description``,
            ``input_schema`` and ``async execute(args)``, see ``HostTool``); declared and
            called like the builtins, and one named like a builtin replaces that builtin.
        raise_could_not_run: raise ``CouldNotRunError`` when the sandbox cannot run a call,
            instead of returning a result with ``metadata.failure = "could_not_run"``.
        env: the environment commands start from, before the secret filter. Default: this
            process's environment on the host, the image's base environment in a container.
        env_extra: variables set for every command on top of the filtered environment —
            never filtered, so the place for a value the host means to pass (e.g. a token
            for one job).
        on_output: called with each ``OutputEvent`` (live stdout/stderr text) of every
            call; ``call(on_output=...)`` overrides it for one call.
        session_id: a name for this session, in ``OutputEvent.session``, job ids and the
            names of output spill files. Default: 8 random hex characters.
        approver: asked (``ReadQuestion``) before a read outside the read scope, when
            ``settings.read_scope`` is on; without one such reads are refused.
        shell_id_persisted: ``settings.shell_id`` was saved from an earlier run: if that
            shell is no longer available, fall back to the first available one
            (``shellFallback`` in the result) instead of refusing.
        lifetime: how long the sandbox lives (``lifetime.py``); by default chosen from
            ``settings.orphan_timeout_s`` (``Toolkit.attach`` passes its own), or, for a
            backend you built, from the ``lifetime`` it was built with (``seam/lifetime.py``:
            ``HostBackend(dir, lifetime=Durable(orphan_timeout_s=900))``).
        backend_options: keyword arguments for the backend class when ``backend`` is a name
            (e.g. ``{"rootless": True, "image": ...}`` for podman).
        interactive_tools: add the model tools ``exec_command`` and ``write_stdin`` (a command
            on a terminal, typed into over several calls: docs/tools.md); off by default.
        snapshot: open the session from this ``Snapshot`` (or its id): the base dir is made
            the snapshot's tree at open — a private directory of its own when ``backend`` is
            a name and no ``base_dir`` is given (docs/branching.md).

    After ``open()``: ``base_dir`` is the absolute base dir, ``info`` the ``SandboxInfo``
    (``local``, ``pid_namespace`` …); ``sandbox`` is the raw API for the host's own commands and
    files (docs/raw-sandbox.md); ``tool_names`` and ``declarations(fmt)`` describe the tools.
    """

    def __init__(
        self,
        backend: BuiltinExec | str = "host",
        *,
        base_dir: str | os.PathLike[str] | None = None,
        confine_to_base_dir: bool = False,
        settings: Settings | Mapping[str, Any] | None = None,
        tools: Mapping[str, bool] | None = None,
        host_tools: Sequence[HostTool] = (),
        raise_could_not_run: bool = False,
        env: Mapping[str, str] | None = None,
        env_extra: Mapping[str, str] | None = None,
        on_output: Callable[[OutputEvent], None] | None = None,
        session_id: str | None = None,
        approver: Approver | None = None,
        shell_id_persisted: bool = False,
        lifetime: Lifetime | None = None,
        backend_options: Mapping[str, Any] | None = None,
        interactive_tools: bool = False,
        snapshot: Snapshot | str | None = None,
    ) -> None:
        if settings is None:
            settings = Settings()
        elif not isinstance(settings, Settings):
            if not isinstance(settings, Mapping):
                raise ConfigurationError("settings must be a Settings or a mapping of its "
                                         f"fields, got {type(settings).__name__}")
            settings = parse_settings(dict(settings))
        # ends with its client, or outlives it (lifetime.py, docs/sessions.md): chosen once —
        # from the settings, or from the lifetime a backend the caller built was built with
        self._lifetime: Lifetime = lifetime or lifetime_for(
            settings, None if isinstance(backend, str) else backend)
        if self._lifetime.orphan_timeout_s and not settings.orphan_timeout_s:
            settings = settings.model_copy(
                update={"orphan_timeout_s": self._lifetime.orphan_timeout_s})
        self.settings: Settings = settings
        if base_dir is not None:
            base_dir = os.fspath(base_dir)  # a pathlib.Path is welcome too
        if confine_to_base_dir and not base_dir:
            raise ConfigurationError("confine_to_base_dir needs a base_dir")
        unknown = sorted(set(tools or {}) - set(BUILTIN_NAMES))
        if unknown:
            raise ConfigurationError(f"tools: unknown builtin(s) {', '.join(unknown)}; "
                                     f"known: {', '.join(BUILTIN_NAMES)}")
        self.session_id = session_id or uuid.uuid4().hex[:8]
        self.confine = confine_to_base_dir
        self.shell_id_persisted = shell_id_persisted
        # what a fork's children get too (branching.py)
        self._branches = Branches(snapshot, {
            "confine_to_base_dir": confine_to_base_dir, "settings": settings, "tools": tools,
            "host_tools": host_tools, "raise_could_not_run": raise_could_not_run, "env": env,
            "env_extra": env_extra, "on_output": on_output, "approver": approver,
            "shell_id_persisted": shell_id_persisted, "interactive_tools": interactive_tools})
        if isinstance(backend, str):
            base_dir, backend_options = self._branches.placed(backend, base_dir,
                                                              backend_options or {})
            backend = backend_for(backend, base_dir, self.settings.limits, backend_options,
                                  self.settings.pull, self._lifetime.backend_lifetime)
        self.backend: BuiltinExec = backend
        self._base_dir_option = base_dir
        self._env_source = env
        self._env_extra = dict(env_extra or {})
        self.on_output = on_output
        self.approver = approver
        builtins = all_builtins()
        enabled = {name: tool for name, tool in builtins.items() if (tools or {}).get(name, True)}
        self._builtins = enabled
        self._host_tools: dict[str, HostTool] = {}
        if interactive_tools:  # exec_command + write_stdin on a terminal (interactive_tools.py)
            self._host_tools.update(pty_tools(self))
        self._host_tools.update({tool.name: tool for tool in host_tools})
        self.services = Session(self.session_id, backend, self.settings, raise_could_not_run,
                                shell_id_persisted)
        self.base_dir = ""
        self.info: SandboxInfo | None = None
        self._call_ids = itertools.count(1)
        self._user_messages: list[str] = []
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.sandbox = RawSandbox(self)  # argv exec with stdin/user, whole-file bytes (raw.py)
        self._egress: SessionEgress | None = None
        # Called with each egress event as its connection ends (serve and MCP stream them).
        self.on_egress: Callable[[EgressEvent], None] | None = None
        self.adopted_jobs: list[int] = []  # jobs an attach found running outside the table
        # accounting, spans and metrics (toolseam/observability): close returns its report
        self._observer = SessionObserver(self.session_id, self.backend.name, self._secrets)

    def _same_loop(self) -> None:
        """Refuse a second event loop with a sentence saying what to do: the agent channel,
        locks and job tasks of an open session are bound to the loop that opened it, and
        would fail deep inside with "attached to a different loop"."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif loop is not self._loop:
            ended = " (that loop has ended)" if self._loop.is_closed() else ""
            raise HostError(
                "this Toolkit was opened in another event loop" + ended + "; each asyncio.run() "
                "starts a new loop, and a session belongs to the loop that opened it. Run the "
                "whole session in one loop (async with Toolkit(...) as tools: ... inside one "
                "asyncio.run), or use SyncToolkit from synchronous code")

    # --- lifecycle ----------------------------------------------------------------------
    async def open(self) -> SandboxInfo:
        """Start the backend, fix the base dir, resolve the shell. Idempotent."""
        if self._closed:
            raise SessionClosedError("the toolkit was closed")
        self._same_loop()
        if self.info is not None:
            return self.info
        with self._observer.lifecycle("open"):
            info = await self._open()
            self._observer.opened_on(self.backend, info, not isinstance(self._lifetime, Ephemeral))
        return info

    async def _open(self) -> SandboxInfo:
        self._check_network()
        self._lifetime.before_open(self.backend)
        info = await self.backend.open()
        base = self._base_dir_option or info.workspace
        if info.local:
            base = os.path.abspath(os.path.expanduser(base))
        elif not base.startswith("/"):
            base = posixpath.join(info.workspace, base)
        await self._check_base_dir(base, info)
        self.base_dir = base
        try:
            await self._branches.opened(self, base)  # from a snapshot: its tree, now
        except BaseException:
            self._closed = True
            await asyncio.shield(self.backend.close())
            await self._branches.closed()
            raise
        source = self._env_source
        if source is None:
            source = os.environ if info.base_env is None else info.base_env
        self.services.command_env = command_environment(source, self.settings.env_allow,
                                                        self._env_extra)
        if self.settings.limits.network == "egress":
            await self._start_egress()
        if self.settings.read_scope is not None:
            scope = ReadScope(self.settings.read_scope, base, self.approver, self.backend,
                              home=self.services.command_env.get("HOME"),
                              local=info.local)
            scope.set_user_messages(self._user_messages)
            self.services.read_scope = scope
        if "bash" in self._builtins and "bash" not in self._host_tools:
            await self.services.start_shells(ShellResolver(
                info.platform, self._executable_exists, self.services.command_env))
        self.info = info
        await self._lifetime.opened(self)
        return info

    def _check_network(self) -> None:
        """The settings and a backend made by the caller must agree on egress mode."""
        made = egress(self.backend).network if supports(self.backend, Egress) else None
        wanted = self.settings.limits.network
        if made is None or (made == "egress") == (wanted == "egress"):
            return
        raise ConfigurationError(
            f"the {self.backend.name} backend was made with network {made!r} but the settings "
            f"say limits.network = {wanted!r}: egress mode needs both (the settings' egress_* "
            "say what it may reach)")

    async def _start_egress(self) -> None:
        """The session's proxy, reached through the agent; its variables win over any other
        source (a sandbox in egress mode has no other way out). On failure nothing is left."""
        from ..egress.session import SessionEgress  # loaded only for egress sessions

        def on_event(event: EgressEvent) -> None:
            self._observer.egress(event)
            if self.on_egress is not None:
                self.on_egress(event)

        try:
            self._egress = await SessionEgress.start(self.settings.egress_table(), self.backend,
                                                     on_event)
        except BaseException:
            self._closed = True
            await self.backend.close()
            raise
        self._egress.scrub(self.services.command_env)  # the credentials never go inside
        self.services.command_env.update(self._egress.environment)
        self.services.on_new_job = self._egress.note_job

    def egress_log(self) -> list[EgressEvent]:
        """The connection attempts through this session's egress proxy, oldest first: the newest
        ``egress_log_kept`` (``on_egress`` sees every one). Empty unless ``limits.network`` is
        ``"egress"``."""
        return [] if self._egress is None else self._egress.events()

    async def _check_base_dir(self, base: str, info: SandboxInfo) -> None:
        """A missing base dir is the host's typo, not the model's: refuse it at open, naming
        it, rather than let every call fail blaming the model's path — and say on which side
        it was looked for (a container's base_dir is inside it: a host directory there is
        the workspace). The backend is closed (nothing left running) and the toolkit with it."""
        found = await self.backend.stat(PathRef(base="/", path=base, confine=False))
        if found.kind == "dir":
            return
        problem = "does not exist" if found.kind == "missing" else "is not a directory"
        self._closed = True
        if not self._lifetime.adopted:  # an attach lets the session go on instead
            await self.backend.close()
        given = self._base_dir_option or base
        raise ConfigurationError(f"base_dir {base} {problem} {side(info)}"
                                 f"{missing_in_sandbox_hint(info, given, 'base_dir')}")

    async def _executable_exists(self, path: str) -> bool:
        found = await self.backend.stat(PathRef(base="/", path=path, confine=False))
        return found.kind == "file" and found.executable

    @property
    def report(self) -> SessionReport | None:
        """What the session used (``SessionReport``), once it is closed (or detached: this
        client's part)."""
        return self._observer.closed() if self._closed else None

    def _secrets(self) -> list[str]:
        """The egress credentials' values: never in a span's recorded content."""
        return [] if self._egress is None else self._egress.proxy.policy.secret_values()

    async def close(self) -> SessionReport:
        """Kill every job and close the backend: no process of this session is left. A sandbox
        working on a copy brings its changes home first; if they cannot come home, its
        container is kept and this raises ``CouldNotRunError`` saying where they are.
        Returns (and logs) what the session used: a ``SessionReport``."""
        if self._closed:
            return self._observer.closed()
        if self.info is not None:
            self._same_loop()
        try:
            with self._observer.lifecycle("close"):
                await self._close()
        finally:
            report = self._observer.closed()
        return report

    async def _close(self) -> None:
        self._closed = True
        try:
            if self.info is not None:
                await remove_spills(self.backend, self.services)  # the host's /tmp outlives us
                await self.services.jobs.close()
            if self._egress is not None:
                await self._egress.close()  # every tunnel ends; new connections are refused
            await self._observer.sample(self.backend)  # its cgroup goes with it
        finally:
            await self.backend.close()
            await self._branches.closed()  # a branch's private workspace (branching.py)
        failure = (cast(WorkspaceTransfer, self.backend).copy_back_error
                   if supports(self.backend, WorkspaceTransfer) else None)
        if failure is not None:  # the container is kept; say so rather than lose the work
            raise failure

    # --- files between host and sandbox -------------------------------------------------
    def _transfer(self) -> WorkspaceTransfer:
        if not supports(self.backend, WorkspaceTransfer):
            raise ConfigurationError(f"the {self.backend.name} backend cannot move files "
                                     "between the host and its sandbox")
        return cast(WorkspaceTransfer, self.backend)

    async def sync(self) -> SyncReport:
        """Bring the sandbox's changes home to the base dir now. A container on an engine that
        shares no filesystem works on a copy (copy mode); elsewhere this changes nothing.
        Close does it too."""
        await self.open()
        with self._observer.lifecycle("copy_back"):
            return await self._transfer().sync()

    async def upload(self, local: str, dest: str) -> None:
        """A host file or directory into the sandbox's workspace as ``dest`` (a step's input)."""
        await self.open()
        await self._transfer().upload(local, dest)

    async def download(self, src: str, local: str) -> None:
        """A file or directory of the sandbox's workspace to ``local`` (a step's output)."""
        await self.open()
        await self._transfer().download(src, local)

    @property
    def enabled_builtins(self) -> list[str]:
        """The builtins this session answers (``tools`` may turn some off)."""
        return sorted(self._builtins)

    # --- branches (branching.py, docs/branching.md) ----------------------------------------
    async def snapshot(self, label: str | None = None) -> Snapshot:
        """The session's files now, kept in this user's store (processes are not: see
        ``Snapshot.processes``). The session goes on."""
        with self._observer.lifecycle("snapshot"):
            return await self._branches.snapshot(self, label)

    async def restore(self, snapshot: Snapshot | str) -> RestoreResult:
        """Make the session's files exactly the snapshot's; running jobs are ended first
        (``ended_jobs``)."""
        with self._observer.lifecycle("restore"):
            return await self._branches.restore(self, snapshot)

    async def fork(self, n: int) -> list[Toolkit | CouldNotRunError]:
        """``n`` (1 to 64) new open sessions of this backend's kind and options, each from this
        session's files now, each in a workspace of its own; one that could not start is a
        ``CouldNotRunError`` in its place."""
        with self._observer.lifecycle("fork", **{"toolseam.fork.count": n}):
            return await self._branches.fork(self, n, type(self))

    async def keep(self) -> SyncReport:
        """Bring this fork's workspace home to the parent's base dir, by the copy-back rule
        (all or nothing; a path both changed keeps the parent's, the branch's beside it)."""
        with self._observer.lifecycle("keep"):
            return await self._branches.keep(self)

    # --- sessions that outlive their client (durable.py, docs/sessions.md) ----------------
    @property
    def handle(self) -> SessionHandle:
        """What another process passes to ``Toolkit.attach`` to continue this session; there
        once the session is open with ``orphan_timeout_s`` above 0 (``ConfigurationError``
        otherwise). It holds the session's secret."""
        if self.info is None:
            raise ConfigurationError("a session has a handle once it is open with the setting "
                                     "orphan_timeout_s above 0")
        return self._lifetime.handle(self)

    async def detach(self) -> SessionHandle:
        """Leave the sandbox and its jobs running, end this client's part, and return the
        handle; the sandbox waits ``orphan_timeout_s`` for an attach. Refused (naming the
        setting) while ``orphan_timeout_s`` is 0."""
        if isinstance(self._lifetime, Ephemeral):  # said before anything opens
            await self._lifetime.detach(self)
        if self._closed:
            raise SessionClosedError("the toolkit was closed")
        await self.open()
        self._same_loop()
        handle = self.handle
        self._closed = True
        self._observer.left()
        await self._lifetime.detach(self)
        return handle

    @classmethod
    async def attach(cls, handle: SessionHandle | str, **options: Any) -> Toolkit:
        """The session ``handle`` names, continued in this process: the same sandbox, jobs,
        files, settings and pinned shell. ``options`` are Toolkit arguments the handle does not
        fix (``on_output``, ``approver``, ``host_tools``, ``raise_could_not_run``,
        ``backend_options``). Raises ``AttachError`` (its ``reason`` says why) and stops
        nothing when it cannot attach."""
        with session_step("attach"):
            return await durable.attach(cls, handle, options)

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
        pinned = await self.services.pin_shell()
        await self._lifetime.changed(self)
        return pinned

    async def end_turn(self) -> list[int]:
        """End the turn: un-kept jobs die, the shell pin is released. Returns killed job ids."""
        self.services.unpin_shell()
        if self.info is None:
            return []
        self._same_loop()
        killed = [job.id for job in await self.services.jobs.end_turn()]
        await self._lifetime.changed(self)
        return killed

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
        """Run one tool call. Tool failures are results; host mistakes raise HostError.

        ``args`` is the call's arguments: a mapping, or the JSON text of one as providers
        deliver it (OpenAI's ``function.arguments``); anything else is a tool failure the
        model reads ("arguments must be a JSON object")."""
        if isinstance(args, str | bytes):
            args = _json_object(args, self.settings.input_limits.json_depth)
        if self._closed:
            raise SessionClosedError("the toolkit was closed")
        if self.info is not None:
            self._same_loop()
        host_tool = self._host_tools.get(name)
        if host_tool is not None:
            return await self._observer.call(name, None, args, host_tool.execute(args))
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
        result = await self._observer.call(name, ctx, args, self._run_builtin(tool, args, ctx))
        await self._lifetime.changed(self)
        return result

    async def _run_builtin(self, tool: Builtin[Any], args: Any, ctx: CallContext) -> ToolResult:
        if self._egress is None:
            result = await tool(args, ctx)
        else:
            from ..egress.session import CURRENT_CALL  # loaded already: egress is on

            mark = self._egress.mark()
            current = CURRENT_CALL.set(ctx.call_id)
            try:
                result = await tool(args, ctx)
            finally:
                CURRENT_CALL.reset(current)
            made = self._egress.since(mark)  # the connections that ended during the call
            if made:
                result = result.model_copy(update={"metadata": {**result.metadata,
                                                                "egress": made}})
            # The model reads why a connection failed, not only the client's "403" (a tunnel
            # still open counts: its event comes when it closes).
            result.model_hints.notes.extend(self._egress.notes(made, result.output, mark))
        return result

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


async def open_toolkit(backend: BuiltinExec, *, private_workspace: str | None = None,
                       **toolkit_kwargs: Any) -> Toolkit:
    """An open ``Toolkit`` on ``backend``, which was made for it (a pool's hand-out); when the
    open fails the backend is closed too, so nothing of it is left. ``private_workspace``: a
    branch workspace made for this session (a snapshot pool's), removed when it closes."""
    tk = Toolkit(backend, **toolkit_kwargs)
    tk._branches.private_workspace = private_workspace
    try:
        await tk.open()
    except BaseException:
        await asyncio.shield(backend.close())
        raise
    return tk
