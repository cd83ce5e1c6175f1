"""``ToolseamWorkspace``: toolseam as a pydantic-ai workspace backend (``pydantic_ai.workspaces``).

``Workspace(ToolseamWorkspace("podman", image=...))`` gives a pydantic-ai agent a toolseam
sandbox — the host, rootful or rootless podman, or docker — with commands, files and symlink
resolution (``SupportsCommands``, ``SupportsFilesystem``, ``SupportsRealpath``,
``SupportsRunInDirectory``). It passes pydantic-ai's own ``WorkspaceBackendSuite`` with every
optional fixture (tests/contract/test_provider_pydantic_ai.py; docs/integrations/pydantic-ai.md).

The environment is a durable toolseam session (docs/sessions.md): built, the backend does no
I/O; its first operation opens the sandbox (once, however many operations start together) and
records ``ref`` at once; ``ToolseamWorkspace.attach(ref)`` reaches it again — from this process
or another one on this machine, a detached process included — and ``await destroy()`` ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, Unpack

from pydantic_ai.workspaces import (
    CommandResult,
    FileEntry,
    WorkspaceOutputLimitError,
    WorkspaceRef,
    WorkspaceTimeoutError,
    WorkspaceUnavailableError,
)
from pydantic_ai.workspaces.protocol import validate_timeout

from ..policy.settings import Settings, parse_settings
from ..seam.errors import ConfigurationError, CouldNotRunError, SessionClosedError
from ..seam.handle import AttachError
from ..session.options import ToolkitOptions
from ..session.raw import ExecResult
from ..session.toolkit import Toolkit
from . import _live
from . import _workspace_files as files
from ._live import PROVIDER, LiveSession
from ._session import LoopThread, Workspace, check_choice, toolkit_arguments

T = TypeVar("T")

DEFAULT_ORPHAN_TIMEOUT_S = 3600  # how long an environment no process is attached to waits
DEFAULT_OUTPUT_LIMIT = 16 << 20  # per stream; more raises WorkspaceOutputLimitError
READ_LIMIT = 1 << 31
_UNAVAILABLE = (CouldNotRunError, SessionClosedError, AttachError)


class ToolseamWorkspace:
    """A pydantic-ai ``WorkspaceBackend`` running in a toolseam sandbox.

    Args:
        backend: a name of the backend table (``toolseam.BACKENDS``: ``"host"`` and the engines).
        image: the container image (podman, docker).
        workspace: the host directory the sandbox works in (the host backend's working dir, or
            the directory a container binds at ``/workspace``). Default: a private temporary
            directory made at first use and removed by ``destroy``.
        output_limit: bytes kept per stream of a command; a command that writes more raises
            ``WorkspaceOutputLimitError`` (the contract forbids a truncated success).
        secret_store: where the attach secrets are kept (default
            ``$XDG_STATE_HOME/toolseam/workspaces``, 0700).
        options: ``Toolkit`` keyword arguments (``settings``, ``env_extra``,
            ``backend_options`` such as ``endpoint`` or ``rootless`` …). ``orphan_timeout_s``
            defaults to an hour: how long the environment waits while no process is attached.
    """

    def __init__(self, backend: str = "host", *, image: str | None = None,
                 workspace: str | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
                 secret_store: str | Path | None = None, **options: Unpack[ToolkitOptions]) -> None:
        check_choice(backend, image)  # a wrong name or image is the caller's, said at once
        self._backend, self._image, self._options = backend, image, options
        self._workspace_dir = workspace
        self._output_limit = output_limit
        self._store = Path(secret_store) if secret_store is not None else _live.default_store()
        self._ref: WorkspaceRef | None = None
        self._attach_to: WorkspaceRef | None = None
        self._session: LiveSession | None = None
        self._runner: LoopThread | None = None
        self._runner_lock = threading.Lock()
        self._opening: asyncio.Lock | None = None  # on the runner's loop: one open at a time

    @classmethod
    def attach(cls, ref: WorkspaceRef, **options: Any) -> ToolseamWorkspace:
        """A backend for the environment ``ref`` names; no I/O until its first operation,
        which raises ``WorkspaceUnavailableError`` if the environment is gone. ``options``:
        ``output_limit``, ``secret_store`` and the ``Toolkit.attach`` options."""
        if ref.provider != PROVIDER:
            raise ValueError(f"not a toolseam workspace ref (provider {ref.provider!r})")
        made = cls(**options)
        made._attach_to = made._ref = ref
        return made

    # --- WorkspaceBackend -------------------------------------------------------------------
    @property
    def ref(self) -> WorkspaceRef | None:
        return self._ref

    async def working_dir(self) -> str:
        session = await self._session_now()
        return session.toolkit.base_dir

    async def destroy(self) -> None:
        """End the environment: every process and the sandbox; the workspace directory too if
        this backend made it. Afterwards an attach by its ref raises
        ``WorkspaceUnavailableError``. Idempotent."""
        session = await self._session_now()
        if session.destroyed:
            return
        session.destroyed = True
        ref = self._ref
        if ref is not None:
            _live.forget(ref.id)
            _live.drop_secret(self._store, ref.id)
        try:
            await session.runner.submit(session.toolkit.close())
        finally:
            session.runner.stop()
            session.workspace.remove()

    async def close(self) -> None:
        """Let go of the environment without ending it (it waits ``orphan_timeout_s`` for an
        attach); another process may attach by the ref only after this, while this one holds it."""
        session = self._session
        if session is None or session.destroyed or self._ref is None:
            return
        _live.forget(self._ref.id)
        self._session = None
        with contextlib.suppress(*_UNAVAILABLE):
            await session.runner.submit(session.toolkit.detach())
        session.runner.stop()

    # --- SupportsCommands / SupportsRunInDirectory ------------------------------------------
    async def run(self, command: str | Sequence[str], *, shell: bool = False,
                  env: Mapping[str, str] | None = None, timeout: float | None = None
                  ) -> CommandResult:
        return await self.run_in_directory(command, cwd=None, shell=shell, env=env,
                                           timeout=timeout)

    async def run_in_directory(self, command: str | Sequence[str], *, cwd: str | None,
                               shell: bool = False, env: Mapping[str, str] | None = None,
                               timeout: float | None = None) -> CommandResult:
        argv = _argv(command, shell)
        validate_timeout(timeout)
        result = await self._call(lambda tk: tk.sandbox.exec(
            argv, cwd=cwd, env=env, timeout=timeout, output_limit=self._output_limit,
            keep_detached=True))
        return _command_result(result, self._output_limit)

    # --- SupportsFilesystem / SupportsRealpath ----------------------------------------------
    async def read_bytes(self, path: str) -> bytes:
        return await self._call(lambda tk: tk.sandbox.read_bytes(path, limit=READ_LIMIT))

    async def write_bytes(self, path: str, data: bytes) -> None:
        await self._call(lambda tk: files.write_bytes(tk, path, data))

    async def stat(self, path: str) -> FileEntry:
        return await self._call(lambda tk: files.stat(tk, path))

    async def list_dir(self, path: str) -> Sequence[FileEntry]:
        return await self._call(lambda tk: files.list_dir(tk, path))

    async def make_dir(self, path: str) -> None:
        await self._call(lambda tk: files.make_dir(tk, path))

    async def remove(self, path: str) -> None:
        await self._call(lambda tk: files.remove(tk, path))

    async def exists(self, path: str) -> bool:
        return await self._call(lambda tk: files.exists(tk, path))

    async def realpath(self, path: str) -> str:
        return await self._call(lambda tk: files.realpath(tk, path))

    # --- the session --------------------------------------------------------------------------
    def _runner_now(self) -> LoopThread:
        with self._runner_lock:  # the first use makes the thread; building made nothing
            if self._runner is None:
                self._runner = LoopThread("toolseam-workspace")
            return self._runner

    async def _session_now(self) -> LiveSession:
        if self._session is not None:
            return self._session
        if self._attach_to is not None:
            shared = _live.find(self._attach_to.id)
            if shared is not None:
                self._session = shared
                return shared
        runner = self._runner_now()
        try:
            # shielded: a caller cancelled mid-create must not lose the environment (its ref)
            return await runner.submit(self._open_once(runner), shielded=True)
        except Exception:  # the open failed (a cancelled caller's open goes on: not here)
            if self._session is None:  # nothing opened: no thread is left behind either
                with self._runner_lock:
                    self._runner = None
                    self._opening = None
                runner.stop()
            raise

    async def _open_once(self, runner: LoopThread) -> LiveSession:
        """On the runner's loop: concurrent first operations share one open."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._session is None:
                self._session = await (self._attach(runner) if self._attach_to is not None
                                       else self._create(runner))
            return self._session

    async def _create(self, runner: LoopThread) -> LiveSession:
        workspace = Workspace(self._workspace_dir)
        options = dict(self._options)
        options["settings"] = _durable_settings(options.get("settings"))
        try:  # a refused option fails after the directory was made: it goes too
            toolkit = Toolkit(self._backend, **toolkit_arguments(self._backend, self._image,
                                                                 workspace, options))
            await toolkit.open()
        except BaseException:
            workspace.remove()
            raise
        handle = toolkit.handle
        ref = WorkspaceRef(provider=PROVIDER, id=_live.ref_id(handle))
        self._ref = ref  # recorded before anything else can fail
        try:
            _live.keep_secret(self._store, handle, workspace.made)
        except OSError:  # no way back to it: end it rather than leave it running unreachable
            await toolkit.close()
            workspace.remove()
            raise
        return _live.register(ref.id, LiveSession(runner, toolkit, workspace))

    async def _attach(self, runner: LoopThread) -> LiveSession:
        assert self._attach_to is not None
        ref = self._attach_to
        kept = _live.handle_from(ref.id, self._store)
        if kept is None:
            raise WorkspaceUnavailableError(f"no toolseam environment is kept for this ref "
                                            f"(destroyed, or another user's): {ref.id[:80]}")
        handle, made = kept
        try:
            toolkit = await Toolkit.attach(handle, **self._options)
        except AttachError as exc:
            raise WorkspaceUnavailableError(f"the toolseam environment is gone ({exc.reason}): "
                                            f"{exc}") from None
        return _live.register(ref.id, LiveSession(runner, toolkit, Workspace(None, made)))

    async def _call(self, operation: Callable[[Toolkit], Coroutine[Any, Any, T]]) -> T:
        """``operation(toolkit)`` on the session's loop, its failures as the contract says."""
        session = await self._session_now()
        try:
            result = await session.runner.submit(operation(session.toolkit))
        except _UNAVAILABLE as exc:
            if session.destroyed or not getattr(exc, "retryable", False):
                raise WorkspaceUnavailableError(f"the toolseam environment is gone: {exc}"
                                                ) from None
            raise
        if session.destroyed:  # a command the destroy killed
            raise WorkspaceUnavailableError("the toolseam environment was destroyed")
        return result


def _durable_settings(given: Any) -> Settings:
    """The caller's settings with an orphan timeout (a ref needs a durable session)."""
    if given is None:
        settings = Settings()
    elif isinstance(given, Settings):
        settings = given
    elif isinstance(given, Mapping):
        settings = parse_settings(dict(given))
    else:
        raise ConfigurationError(f"settings must be a Settings or a mapping, got "
                                 f"{type(given).__name__}")
    if settings.orphan_timeout_s <= 0:
        settings = settings.model_copy(update={"orphan_timeout_s": DEFAULT_ORPHAN_TIMEOUT_S})
    return settings


def _argv(command: str | Sequence[str], shell: bool) -> list[str]:
    if shell:
        if not isinstance(command, str):
            raise TypeError("shell=True takes the command as one string")
        return ["sh", "-c", command]
    if isinstance(command, str | bytes) or not isinstance(command, Sequence):
        raise TypeError("a command without shell=True is an argv sequence, not a string")
    argv = list(command)
    if not argv:
        raise ValueError("argv must not be empty")
    if not all(isinstance(arg, str) for arg in argv):
        raise TypeError("argv items must be strings")
    return argv


def _command_result(result: ExecResult, limit: int) -> CommandResult:
    if result.timed_out:
        raise WorkspaceTimeoutError(f"{result.argv[0]} timed out and was killed",
                                    stdout=result.stdout, stderr=result.stderr)
    if result.stdout_truncated or result.stderr_truncated:
        raise WorkspaceOutputLimitError(f"{result.argv[0]} wrote more than {limit} bytes to a "
                                        "stream", limit=limit, stdout=result.stdout,
                                        stderr=result.stderr)
    code = result.exit_code if result.exit_code is not None else -(result.signal or 0)
    return CommandResult(exit_code=code, stdout=result.stdout, stderr=result.stderr)


__all__ = ["ToolseamWorkspace"]
