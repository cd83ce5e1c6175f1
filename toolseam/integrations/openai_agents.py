"""toolseam as a sandbox provider of the OpenAI Agents SDK (``agents.sandbox``, 0.24).

``ToolseamSandboxClient`` is a ``BaseSandboxClient``: a ``SandboxAgent`` run with
``SandboxRunConfig(client=ToolseamSandboxClient(), options=ToolseamSandboxClientOptions(...))``
gets its shell, apply_patch and file capabilities served by one toolseam session — the host,
podman (rootful or rootless) or docker, or a warm ``SandboxPool``'s container. Every call goes
through toolseam's public API: ``Toolkit`` and its raw sandbox (``tools.sandbox``), durable
sessions (``tools.handle``, ``Toolkit.attach``) and the pool (docs/integrations/openai-agents.md).

How the SDK's calls map (decisions 180-184):

* ``create`` opens the session at once (from the pool when the options name one), so the state
  is serialisable — and re-attachable — as soon as ``create`` returns.
* ``resume`` attaches to the durable session the state's handle names; a session that ended
  (closed, or orphaned past ``orphan_timeout_s``) is replaced by a new sandbox, which the SDK
  then hydrates from the snapshot.
* ``exec`` is ``tools.sandbox.exec`` with ``keep_detached``: an argv in the workspace root; what
  it starts in the background (``nohup … &``) keeps running after it returns, as with the SDK's
  own clients, until the session ends; a timeout kills the command's own process group
  (``ExecTimeoutError``).
* ``read``/``write`` are whole-file bytes, confined to the workspace (a symlink out of it is
  refused by the agent, not followed); ``persist_workspace``/``hydrate_workspace`` a tar of it.
* ``snapshot=ToolseamSnapshotSpec()`` keeps the persisted workspace in toolseam's snapshot
  store: a toolseam session's own snapshot and restore, no tar (``openai_agents_snapshot.py``).
* The PTY is ``tools.sandbox.pty_*`` where the backend has the ``InteractiveProcesses``
  capability (every agent-run backend: ``supports_pty()`` asks it); exposed ports use
  ``expose`` where the installed toolseam has it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import os
import posixpath
import shutil
import tarfile
import tempfile
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    ExposedPortUnavailableError,
    PtySessionNotFoundError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_types import (
    PtyExecUpdate,
    clamp_pty_yield_time_ms,
    resolve_pty_write_yield_time_ms,
    truncate_text_by_tokens,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.workspace_payloads import coerce_write_payload
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tarfile
from pydantic import ConfigDict, Field, model_validator

from ..backends import (
    KnownBackend,
    backend_class,
    backend_kind,
    check_backend_options,
    create_backend,
)
from ..seam.capabilities import (
    ExposedPorts,
    hand_workspace_to_sandbox,
    supports,
    supports_interactive,
)
from ..seam.errors import ConfigurationError, ToolseamError
from ..seam.handle import AttachError, SessionHandle
from ..session.raw import UnknownUserError, UserUnsupportedError
from ..session.toolkit import Toolkit
from ._session import check_choice
from .openai_agents_snapshot import ToolseamSnapshot, ToolseamSnapshotSpec

__all__ = ["ToolseamSandboxClient", "ToolseamSandboxClientOptions", "ToolseamSandboxSession",
           "ToolseamSandboxSessionState", "ToolseamSnapshot", "ToolseamSnapshotSpec"]

BACKEND_ID = "toolseam"
CONTAINER_WORKSPACE = "/workspace"
_SDK_DEFAULT_ROOT = "/workspace"  # Manifest.root's default
_DURABLE_DEFAULT_S = 600.0  # how long a sandbox whose client died waits for a resume
_EXEC_OUTPUT_LIMIT = 16 << 20  # the SDK expects a command's whole output (its tools cut it)
_ARCHIVE_LIMIT = 2 << 30  # the largest workspace tar persist_workspace reads back
_PTY_READ_BYTES = 1 << 20
_ENDED = ("ended", "gone")  # attach refusals a new sandbox answers; the others are raised


class ToolseamSandboxClientOptions(BaseSandboxClientOptions):
    """Where the sandbox runs. ``image``: a container backend's image, where the SDK's own
    ``DockerSandboxClientOptions(image=…)`` has it. ``backend_options`` are the backend's other
    keyword options (``rootless``, ``endpoint``, ``workspace_mode`` …; JSON values: they are
    kept in the session state to make a replacement at resume), ``settings`` toolseam's
    settings. An option neither this model nor the backend knows is refused by name.

    ``orphan_timeout_s``: how long a sandbox whose client died waits for ``resume`` (a durable
    session; default 600 s, 0 for none; a pooled sandbox cannot be durable). ``pool``: a
    ``SandboxPool`` to take the sandbox from (its backend and options win; not serialised)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["toolseam"] = "toolseam"
    backend: KnownBackend = "host"
    image: str | None = None
    backend_options: dict[str, Any] = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)
    orphan_timeout_s: float | None = None
    exposed_ports: tuple[int, ...] = ()
    pool: Any = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _options_the_backend_takes(self) -> ToolseamSandboxClientOptions:
        check_choice(self.backend, self.image)
        given = self.backend_options.get("image")
        if self.image is not None and given is not None and given != self.image:
            raise ConfigurationError(f"image {self.image!r} and backend_options['image'] "
                                     f"{given!r} disagree; give the image once, as image=")
        if self.pool is None:  # a pool's own options win (and were checked when it was made)
            check_backend_options(self.backend, backend_class(self.backend),
                                  {"workspace": None, **self.backend_options})
        return self

    def backend_arguments(self) -> dict[str, Any]:
        """The backend's keyword options, the image among them."""
        chosen = dict(self.backend_options)
        if self.image is not None:
            chosen["image"] = self.image
        return chosen


class ToolseamSandboxSessionState(SandboxSessionState):
    """What ``resume`` needs. ``handle`` holds the durable session's secret (the right to
    attach): store a serialised state as you would a credential."""

    type: Literal["toolseam"] = "toolseam"
    backend: KnownBackend = "host"
    backend_options: dict[str, Any] = Field(default_factory=dict)
    settings: dict[str, Any] = Field(default_factory=dict)
    handle: str | None = None
    host_dir: str | None = None  # the host directory the sandbox works in (or copies)
    host_dir_owned: bool = False  # made by the client: delete() removes it


class ToolseamSandboxSession(BaseSandboxSession):
    """One toolseam session behind the SDK's session interface."""

    state: ToolseamSandboxSessionState

    def __init__(self, *, state: ToolseamSandboxSessionState, toolkit: Toolkit) -> None:
        self.state = state
        self.toolkit = toolkit
        self._running = True
        self._ptys: set[int] = set()
        self._ports: dict[int, ExposedPortEndpoint] = {}

    # --- lifecycle ----------------------------------------------------------------------
    async def _prepare_backend_workspace(self) -> None:
        await self._mkdir_root()

    async def _mkdir_root(self) -> None:
        done = await self.toolkit.sandbox.exec(["mkdir", "-p", self.state.manifest.root], cwd="/")
        if not done.success:
            raise WorkspaceArchiveWriteError(path=Path(self.state.manifest.root),
                                             context={"stderr": done.stderr})

    async def running(self) -> bool:
        return self._running

    # --- snapshots in toolseam's store (openai_agents_snapshot.py): no tar ------------------
    async def _persist_snapshot(self) -> None:
        snapshot = self.state.snapshot
        if not isinstance(snapshot, ToolseamSnapshot) or not self._snapshot_is_workspace():
            await super()._persist_snapshot()
            return
        await snapshot.keep(self.toolkit)
        # no fingerprint: a resume restores, and a toolseam restore costs what changed
        self.state.snapshot_fingerprint = None
        self.state.snapshot_fingerprint_version = None

    async def _restore_snapshot_into_workspace_on_resume(self) -> None:
        snapshot = self.state.snapshot
        if not isinstance(snapshot, ToolseamSnapshot) or not self._snapshot_is_workspace():
            await super()._restore_snapshot_into_workspace_on_resume()
            return
        await snapshot.put_back(self.toolkit)

    def _snapshot_is_workspace(self) -> bool:
        """A toolseam snapshot of the session (its base dir: ``/workspace`` in a container)
        is exactly what the SDK persists: the manifest's root is that dir and nothing in it
        is left out of persistence; else the SDK's tar goes into the store."""
        base = self.toolkit.base_dir
        return (bool(base) and posixpath.normpath(self.state.manifest.root) == base
                and not self._persist_workspace_skip_relpaths())

    async def _shutdown_backend(self) -> None:
        self._running = False
        await self.toolkit.close()  # every job ends with the sandbox; idempotent

    # --- commands -----------------------------------------------------------------------
    def _prepare_exec_command(self, *command: str | Path, shell: bool | list[str],
                              user: str | User | None) -> list[str]:
        # On the host, as the SDK's own unix_local client: `sh -c`, not a login shell — this
        # machine's profile costs ~9 ms a command here and the session's environment is set.
        if shell is True and self.toolkit.info is not None and self.toolkit.info.local:
            shell = ["sh", "-c"]
        return super()._prepare_exec_command(*command, shell=shell, user=user)

    async def exec(self, *command: str | Path, timeout: float | None = None,
                   shell: bool | list[str] = True, user: str | User | None = None) -> ExecResult:
        # a user goes to toolseam's own switch (no sudo needed in the image)
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        name = user.name if isinstance(user, User) else user
        return await self._run(argv, timeout, name)

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None
                             ) -> ExecResult:
        return await self._run([str(part) for part in command], timeout, None)

    async def _run(self, argv: list[str], timeout: float | None, user: str | None) -> ExecResult:
        if timeout is not None and timeout <= 0:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        try:
            # the SDK's own clients leave what a command starts in the background running
            # (a dev server the agent then tests); the session's end still ends it
            done = await self.toolkit.sandbox.exec(
                argv, cwd=self.state.manifest.root, timeout=timeout, user=user,
                output_limit=_EXEC_OUTPUT_LIMIT, keep_detached=True)
        except PermissionError as exc:  # there but not executable: what a shell answers
            return ExecResult(stdout=b"", stderr=f"{exc}\n".encode(), exit_code=126)
        except (OSError, ToolseamError, UserUnsupportedError, UnknownUserError) as exc:
            raise ExecTransportError(command=argv, cause=exc) from exc
        if done.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        code = done.exit_code if done.exit_code is not None else 128 + (done.signal or 0)
        return ExecResult(stdout=done.stdout.encode(), stderr=done.stderr.encode(),
                          exit_code=code)

    # --- files --------------------------------------------------------------------------
    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        target = self.normalize_path(path)
        try:
            data = await self.toolkit.sandbox.read_bytes(str(target), limit=_ARCHIVE_LIMIT)
        except FileNotFoundError as exc:
            raise WorkspaceReadNotFoundError(path=Path(path), cause=exc) from exc
        except (OSError, ToolseamError) as exc:
            raise WorkspaceArchiveReadError(path=Path(path), cause=exc) from exc
        return io.BytesIO(data)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None
                    ) -> None:
        payload = coerce_write_payload(path=Path(path), data=data)
        target = self.normalize_path(path, for_write=True)
        content = payload.stream.read()
        try:
            await self.toolkit.sandbox.write_bytes(str(target), content)
        except (OSError, ToolseamError) as exc:
            raise WorkspaceArchiveWriteError(path=Path(path), cause=exc) from exc

    async def persist_workspace(self) -> io.IOBase:
        """The workspace as a tar of workspace-relative members (``./…``), made by ``tar``
        inside the sandbox and carried out as base64 text (no file outside the workspace
        the session's confinement would refuse; tar's status is stderr's last line)."""
        root = self.state.manifest.root
        excludes = [f"--exclude=./{rel.as_posix()}"
                    for rel in sorted(self._persist_workspace_skip_relpaths())]
        script = '{ tar -C "$0" -cf - "$@" .; echo "$?" >&2; } | base64 -w 0'
        try:
            done = await self.toolkit.sandbox.exec(
                ["sh", "-c", script, root, *excludes], cwd="/",
                output_limit=_ARCHIVE_LIMIT * 4 // 3 + 4)
        except (OSError, ToolseamError) as exc:
            raise WorkspaceArchiveReadError(path=Path(root), cause=exc) from exc
        status = done.stderr.rstrip("\n").rpartition("\n")[2]
        if not done.success or status != "0" or done.stdout_truncated:
            raise WorkspaceArchiveReadError(path=Path(root), context={"stderr": done.stderr})
        return io.BytesIO(base64.b64decode(done.stdout))

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """A tar from ``persist_workspace`` (or any portable one) unpacked in the root; its
        members are checked on this side first (no absolute path, no ``..``, no link out)."""
        root = self.state.manifest.root
        raw = data.read()
        archive = raw.encode() if isinstance(raw, str) else bytes(raw or b"")
        try:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
                validate_tarfile(tar, allow_external_symlink_targets=False)
        except UnsafeTarMemberError as exc:
            raise WorkspaceArchiveWriteError(
                path=Path(root), context={"reason": exc.reason, "member": exc.member},
                cause=exc) from exc
        except (tarfile.TarError, OSError) as exc:
            raise WorkspaceArchiveWriteError(path=Path(root), cause=exc) from exc
        await self._mkdir_root()
        try:
            done = await self.toolkit.sandbox.exec(
                ["tar", "-C", root, "--no-same-owner", "-xf", "-"], stdin=archive, cwd="/")
        except (OSError, ToolseamError) as exc:
            raise WorkspaceArchiveWriteError(path=Path(root), cause=exc) from exc
        if not done.success:
            raise WorkspaceArchiveWriteError(path=Path(root), context={"stderr": done.stderr})

    # --- PTY and ports: the raw API's, where this toolseam has them ------------------------
    def supports_pty(self) -> bool:
        return supports_interactive(self.toolkit.backend)

    async def pty_exec_start(self, *command: str | Path, timeout: float | None = None,
                             shell: bool | list[str] = True, user: str | User | None = None,
                             tty: bool = False, yield_time_s: float | None = None,
                             max_output_tokens: int | None = None) -> PtyExecUpdate:
        if not self.supports_pty():
            return await super().pty_exec_start(*command, timeout=timeout, shell=shell,
                                                user=user, tty=tty, yield_time_s=yield_time_s,
                                                max_output_tokens=max_output_tokens)
        argv = self._prepare_exec_command(*command, shell=shell, user=user)
        sandbox: Any = self.toolkit.sandbox
        try:
            pid = int(await sandbox.pty_start(argv, cwd=self.state.manifest.root, tty=tty))
        except (OSError, ToolseamError) as exc:
            raise ExecTransportError(command=argv, cause=exc) from exc
        self._ptys.add(pid)
        window = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._collect(pid, clamp_pty_yield_time_ms(window), max_output_tokens)

    async def pty_write_stdin(self, *, session_id: int, chars: str,
                              yield_time_s: float | None = None,
                              max_output_tokens: int | None = None) -> PtyExecUpdate:
        if not self.supports_pty():
            return await super().pty_write_stdin(session_id=session_id, chars=chars,
                                                 yield_time_s=yield_time_s,
                                                 max_output_tokens=max_output_tokens)
        sandbox: Any = self.toolkit.sandbox
        if chars:
            try:  # a process of a session this object resumed is not in _ptys: ask the agent
                await sandbox.pty_write(session_id, chars.encode())
            except (LookupError, ValueError, ToolseamError) as exc:
                raise PtySessionNotFoundError(session_id=session_id, cause=exc) from exc
        window = resolve_pty_write_yield_time_ms(
            yield_time_ms=250 if yield_time_s is None else int(yield_time_s * 1000),
            input_empty=chars == "")
        return await self._collect(session_id, window, max_output_tokens)

    async def _collect(self, pid: int, window_ms: int, max_tokens: int | None) -> PtyExecUpdate:
        """Output until the window ends or the process does (the SDK's yield semantics)."""
        sandbox: Any = self.toolkit.sandbox
        deadline = time.monotonic() + window_ms / 1000
        output = bytearray()
        exit_code: int | None = None
        while True:
            remaining = max(1, int((deadline - time.monotonic()) * 1000))
            try:
                got = await sandbox.pty_read(pid, yield_ms=remaining, max_bytes=_PTY_READ_BYTES)
            except (LookupError, ValueError, ToolseamError) as exc:
                raise PtySessionNotFoundError(session_id=pid, cause=exc) from exc
            output.extend(got.data)
            if got.exited:
                exit_code = got.exit_code if got.exit_code is not None else -1
                break
            if time.monotonic() >= deadline:
                break
        text, original = truncate_text_by_tokens(output.decode("utf-8", "replace"), max_tokens)
        if exit_code is not None:
            self._ptys.discard(pid)
        return PtyExecUpdate(process_id=None if exit_code is not None else pid,
                             output=text.encode(), exit_code=exit_code,
                             original_token_count=original)

    async def pty_terminate_all(self) -> None:
        sandbox: Any = self.toolkit.sandbox
        pids, self._ptys = self._ptys, set()
        for pid in pids:
            with contextlib.suppress(Exception):
                await sandbox.pty_terminate(pid)

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        """``tools.sandbox.expose``: a 127.0.0.1 listener here carried into the sandbox's port
        over the session's channel (no network inside needed), one per port, kept until the
        session ends."""
        if port in self._ports:
            return self._ports[port]
        if not supports(self.toolkit.backend, ExposedPorts):
            return await super()._resolve_exposed_port(port)
        try:
            exposed = await self.toolkit.sandbox.expose(port)
        except (OSError, ValueError, ToolseamError) as exc:
            raise ExposedPortUnavailableError(
                port=port, exposed_ports=self.state.exposed_ports, reason="backend_unavailable",
                context={"backend": BACKEND_ID}, cause=exc) from exc
        self._ports[port] = ExposedPortEndpoint(host=exposed.host, port=exposed.port, tls=False)
        return self._ports[port]


class ToolseamSandboxClient(BaseSandboxClient[ToolseamSandboxClientOptions | None]):
    """Sessions on toolseam backends; without options, a durable session on the host."""

    backend_id = BACKEND_ID
    supports_default_options = True

    def __init__(self, *, instrumentation: Instrumentation | None = None,
                 dependencies: Dependencies | None = None) -> None:
        self._instrumentation = instrumentation or Instrumentation()
        self._dependencies = dependencies

    async def create(self, *, snapshot: SnapshotSpec | SnapshotBase | None = None,
                     manifest: Manifest | None = None,
                     options: ToolseamSandboxClientOptions | None = None) -> SandboxSession:
        opts = options or ToolseamSandboxClientOptions()
        manifest = self._validate_manifest_for_create(manifest or Manifest())
        if opts.pool is not None and opts.orphan_timeout_s:
            raise ValueError("a pooled sandbox cannot be durable (orphan_timeout_s): it was "
                             "started as an ordinary one; leave orphan_timeout_s unset")
        orphan = opts.orphan_timeout_s
        if orphan is None:
            orphan = 0.0 if opts.pool is not None else _DURABLE_DEFAULT_S
        session_id = uuid.uuid4()
        state = ToolseamSandboxSessionState(
            session_id=session_id, manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            exposed_ports=opts.exposed_ports, backend=opts.backend,
            backend_options=opts.backend_arguments(),
            settings={**opts.settings, "orphan_timeout_s": orphan})
        toolkit = await _open_sandbox(state, opts.pool)
        inner = ToolseamSandboxSession(state=state, toolkit=toolkit)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """End the sandbox (already ended after ``shutdown``: nothing to do) and remove the
        host directory the client made for it."""
        inner = session._inner
        if not isinstance(inner, ToolseamSandboxSession):
            raise TypeError("ToolseamSandboxClient.delete expects a ToolseamSandboxSession")
        try:
            await inner.toolkit.close()
        finally:
            inner._running = False
            if inner.state.host_dir_owned and inner.state.host_dir:
                shutil.rmtree(inner.state.host_dir, ignore_errors=True)
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """Attach to the durable session the state names; one that has ended is replaced by a
        new sandbox (the SDK hydrates it from the snapshot at start)."""
        if not isinstance(state, ToolseamSandboxSessionState):
            raise TypeError("ToolseamSandboxClient.resume expects a ToolseamSandboxSessionState")
        state.assert_path_grants_rebound()
        toolkit: Toolkit | None = None
        # delete() removes the directory the client made only after ending the session: a
        # state whose directory is gone names a session that ended (a container's attach
        # would refuse the missing directory before asking the engine)
        deleted = state.host_dir_owned and not (state.host_dir and os.path.isdir(state.host_dir))
        if state.handle and not deleted:
            try:
                toolkit = await Toolkit.attach(SessionHandle.from_json(state.handle))
            except AttachError as exc:
                if exc.reason not in _ENDED:
                    raise
        preserved = toolkit is not None
        if toolkit is None:
            state.workspace_root_ready = False
            toolkit = await _open_sandbox(state, None)
        inner = ToolseamSandboxSession(state=state, toolkit=toolkit)
        inner._set_start_state_preserved(preserved)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, ToolseamSandboxSessionState)


async def _open_sandbox(state: ToolseamSandboxSessionState, pool: Any) -> Toolkit:
    """Open the session ``state`` describes (its root and host directory fixed here), record
    the durable handle; on failure nothing is left (no sandbox, no directory)."""
    if any(grant.host_path is not None for grant in state.manifest.extra_path_grants):
        raise ValueError("ToolseamSandboxClient does not support path grants with a host_path")
    env = await state.manifest.environment.resolve()
    made_dir: str | None = None
    toolkit: Toolkit | None = None
    try:
        if not backend_kind(state.backend).contained and pool is None:
            root = state.manifest.root
            if root == _SDK_DEFAULT_ROOT or state.host_dir_owned:
                if not (state.host_dir and os.path.isdir(state.host_dir)):
                    made_dir = tempfile.mkdtemp(prefix="toolseam-openai-ws-")
                    state.host_dir, state.host_dir_owned = made_dir, True
                root = state.host_dir
                state.manifest = state.manifest.model_copy(update={"root": root}, deep=True)
            os.makedirs(root, exist_ok=True)
            toolkit = Toolkit("host", base_dir=root, confine_to_base_dir=True,
                              settings=state.settings, env_extra=env)
        else:
            root = posixpath.normpath(state.manifest.root)
            if PurePosixPath(CONTAINER_WORKSPACE) not in (PurePosixPath(root),
                                                          *PurePosixPath(root).parents):
                raise ValueError(f"manifest.root {root} is outside {CONTAINER_WORKSPACE}, the "
                                 "only writable tree of a toolseam container")
            if not (state.host_dir and os.path.isdir(state.host_dir)):
                made_dir = tempfile.mkdtemp(prefix="toolseam-openai-ws-")
                state.host_dir, state.host_dir_owned = made_dir, True
            if pool is not None:
                # the options describe the pool's engine: whose user a rootless one maps to
                hand_workspace_to_sandbox(create_backend(state.backend, workspace=state.host_dir,
                                                    **state.backend_options), state.host_dir)
                pooled = await pool.backend(state.host_dir)  # a warm sandbox, open
                try:
                    toolkit = Toolkit(pooled, base_dir=CONTAINER_WORKSPACE,
                                      confine_to_base_dir=True, settings=state.settings,
                                      env_extra=env)
                except BaseException:
                    await asyncio.shield(pooled.close())
                    raise
            else:
                toolkit = Toolkit(state.backend, base_dir=CONTAINER_WORKSPACE,
                                  confine_to_base_dir=True, settings=state.settings,
                                  env_extra=env, backend_options={**state.backend_options,
                                                                  "workspace": state.host_dir})
                hand_workspace_to_sandbox(toolkit.backend, state.host_dir)
        assert toolkit is not None
        await toolkit.open()
        done = await toolkit.sandbox.exec(["mkdir", "-p", state.manifest.root], cwd="/")
        if not done.success:
            raise ValueError(f"cannot make the workspace root {state.manifest.root}: "
                             f"{done.stderr.strip()}")
        state.handle = toolkit.handle.to_json() if toolkit.settings.orphan_timeout_s > 0 else None
        return toolkit
    except BaseException:
        if toolkit is not None:
            await asyncio.shield(toolkit.close())
        if made_dir is not None:
            shutil.rmtree(made_dir, ignore_errors=True)
            state.host_dir, state.host_dir_owned = None, False
        raise
