"""``Session``: the policy state of one session, which the builtins reach through
``builtins.SessionView`` — settings, the resolved (and pinned) shell, the command environment,
detached jobs, the read scope, and the files the model has seen."""

from __future__ import annotations

from typing import Any

from ..seam.errors import ConfigurationError, HostError, ShellChangedError
from ..seam.protocol import BuiltinExec
from .jobs import JobRegistry
from .readscope import ReadScope
from .settings import Settings
from .shells import ShellChoice, ShellResolver, check_pin


class Session:
    """One session's policy state: what the builtins ask of it (``builtins.SessionView``) —
    settings, shell, environment, jobs, read scope, files the model has seen."""

    def __init__(self, session_id: str, backend: BuiltinExec, settings: Settings,
                 raise_could_not_run: bool, shell_id_persisted: bool) -> None:
        self.session_id = session_id
        self.shell_id_persisted = shell_id_persisted
        self.settings = settings
        self.raise_could_not_run = raise_could_not_run
        self.jobs = JobRegistry(backend, settings.max_jobs)
        self.command_env: dict[str, str] = {}
        self.read_scope: ReadScope | None = None
        self._shell: ShellChoice | None = None
        self._pinned: ShellChoice | None = None
        self._resolver: ShellResolver | None = None
        self._next_job_id = 1
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
        job_id = f"{self.session_id}-{self._next_job_id}"
        self._next_job_id += 1
        return job_id

    # --- a session that outlives its client keeps this with its agent (durable.py) -------
    def saved(self) -> dict[str, Any]:
        """What another process needs to continue this session's policy state."""
        pinned = self._pinned
        return {"command_env": dict(self.command_env), "files_read": sorted(self._files_read),
                "next_job_id": self._next_job_id, "jobs": self.jobs.saved(),
                "pinned": None if pinned is None else {"argv": list(pinned.argv),
                                                       "id": pinned.id,
                                                       "fallback": pinned.fallback}}

    def restore(self, saved: dict[str, Any]) -> None:
        """Put back what ``saved`` gave (after ``start_shells``: a pinned shell stays pinned)."""
        self.command_env = dict(saved["command_env"])
        self._files_read = set(saved["files_read"])
        self._next_job_id = int(saved["next_job_id"])
        self.jobs.restore(saved["jobs"])
        pinned = saved["pinned"]
        if pinned is not None:
            self._shell = self._pinned = ShellChoice(tuple(pinned["argv"]), pinned["id"],
                                                     bool(pinned["fallback"]))

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
        return await self._resolver.resolve(s.shell, s.shell_id, self.shell_id_persisted)

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

    async def hidden_in_search(self, tool: str, root: str, rels: set[str]) -> dict[str, str]:
        """Files a search found that the read scope will not show (``ReadScope``)."""
        if self.read_scope is None:
            return {}
        return await self.read_scope.hidden_in_search(tool, root, rels)

    async def check_command(self, command: str, cwd: str) -> None:
        if self.read_scope is not None:
            await self.read_scope.check_command(command, cwd)
