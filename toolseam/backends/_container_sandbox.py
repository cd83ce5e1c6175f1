"""What the podman and docker backends share, by composition: one warm container per session.

The container runs the sandbox agent (the staged bundle of ``boot.stage_bundle``) as its main
process: pid 1 of the container, which no command can kill. Every call is a line on one
channel to it — about a millisecond, never an engine ``exec`` per call. Two ways to get there
(``WorkspaceMode``, chosen by ``resolve_mode``):

* **bind** (a local engine): the workspace, the bundle and a socket directory are bind mounts;
  the agent listens on a unix socket the host connects to.
* **copy** (an engine that shares no filesystem with the host — another machine): nothing of
  the host's is mounted. The bundle goes once into a volume per engine and agent version, the
  base dir is copied in through the engine's archive API before the start and copied back on
  ``sync`` and at close (``_workspace_copy``), and the channel is the engine's attach stream
  to the agent's stdin/stdout (``_attach``).

Engines differ only in how a container is created, inspected and removed: that is the
``Engine`` protocol each backend implements with its own SDK.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import tarfile
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Literal, Protocol, TypeVar

import psutil

from toolseam_agent.setid_guard import MODE_VAR as GUARD_VAR

from ..policy.limits import size_bytes
from ..seam.errors import CouldNotRunError
from ..seam.models import SandboxInfo, SyncReport
from ._attach import EngineAddress, attach_channel
from ._pull import PullCallback, PullPolicy
from ._retry import transient_retry
from ._workspace_copy import DEFAULT_COPY_LIMIT, WorkspaceCopy
from .agentlink.channel import AgentChannel
from .boot import bundle_archive, bundle_command, bundle_digest, stage_bundle
from .bundle_arch import select_bundle
from .staging import staging_root

OWNER_LABEL = "toolseam.owner"
SESSION_LABEL = "toolseam.session"
WORKSPACE = "/workspace"
AGENT_MOUNT = "/opt/toolseam"
SOCKET_MOUNT = "/run/toolseam"
AGENT_VOLUME_LABEL = "toolseam.agent"
# Work kept after a failed copy-back: engines cannot relabel a container or volume, so a
# marker volume carries the labels (no owner label: no janitor takes it for an orphan).
KEPT_LABEL = "toolseam.kept"  # unix time it was kept
KEPT_CONTAINER_LABEL = "toolseam.kept.container"
KEPT_VOLUME_LABEL = "toolseam.kept.volume"
KEPT_WORKSPACE_LABEL = "toolseam.kept.workspace"  # the host dir the work was going to
KEPT_RETENTION_S = 7 * 24 * 3600  # then the janitor removes it (docs/containers.md)
WorkspaceMode = Literal["auto", "bind", "copy"]
WORKSPACE_MODES: tuple[WorkspaceMode, ...] = ("auto", "bind", "copy")
_CONNECT_TIMEOUT_S = 15.0

T = TypeVar("T")
_ENGINE_ARCH: dict[str, str] = {}


@dataclass(frozen=True)
class Hardening:
    """The sandbox's defaults (CONTRACT §9); every one can be overridden by the host."""

    network: str = "none"
    read_only_root: bool = True
    tmpfs_size: str = "512m"
    drop_all_capabilities: bool = True
    no_new_privileges: bool = True
    pids_limit: int = 1024
    memory: str = "2g"
    cpus: float | None = None
    nofile: int = 1024  # below the hard limit: the engine cannot raise rlimits here
    nproc: int = 4096
    # No engine init: the agent itself is pid 1 (it reaps every orphan), because the kernel
    # spares a namespace's pid 1 from signals sent inside it — `kill -9 -1` from a command
    # would otherwise kill the agent with everything else and end the session.
    init: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    image: str
    name: str
    command: list[str]
    labels: dict[str, str]
    environment: dict[str, str]
    binds: list[tuple[str, str, bool]]  # (host path, container path, read only)
    hardening: Hardening
    volumes: list[tuple[str, str, bool]] = field(default_factory=list)  # (name, path, read only)
    stdin_open: bool = False  # the channel is the attach stream to the agent's stdin/stdout


@dataclass
class ContainerState:
    running: bool
    exit_code: int | None
    oom_killed: bool
    status: str
    error: str = ""


class Engine(Protocol):
    """One engine SDK behind the calls the sandbox needs (synchronous; run in threads)."""

    endpoint: str
    address: EngineAddress  # where the attach stream connects (unix, TCP, TLS)

    def ping(self) -> None: ...
    def image_exists(self, image: str) -> bool: ...
    def pull(self, image: str, auth: dict[str, str] | None, on_progress: PullCallback | None
             ) -> None: ...
    def create(self, spec: ContainerSpec) -> str: ...
    def start(self, container: str) -> None: ...
    def attach_path(self, container: str) -> str: ...
    def put_archive(self, container: str, path: str, data: IO[bytes]) -> None: ...
    def get_archive(self, container: str, path: str) -> contextlib.AbstractContextManager[
        Iterator[bytes]]: ...
    def path_stat(self, container: str, path: str) -> dict[str, Any] | None: ...
    def volume_exists(self, name: str) -> bool: ...
    def create_volume(self, name: str, labels: dict[str, str]) -> None: ...
    def remove_volume(self, name: str) -> None: ...
    def labeled_volumes(self, label: str) -> list[tuple[str, dict[str, str]]]: ...
    def arch(self) -> str: ...  # the engine machine's CPU, as the engine names it
    def state(self, container: str) -> ContainerState: ...
    def host_config(self, container: str) -> dict[str, Any]: ...
    def logs(self, container: str) -> str: ...
    def remove(self, container: str) -> None: ...
    def labeled(self, label: str) -> list[tuple[str, dict[str, str]]]: ...
    def close(self) -> None: ...


GO_MODE_SYMLINK = 1 << 27  # os.ModeSymlink in the engines' path stat (Go's FileMode)


def decode_path_stat(header: str | None) -> dict[str, Any]:
    """The archive API's ``X-Docker-Container-Path-Stat`` header (base64 JSON: name, size,
    mode as Go's FileMode, mtime, linkTarget), the same on docker and podman."""
    if not header:
        return {}
    return dict(json.loads(base64.b64decode(header)))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def owner_label() -> str:
    """host:pid:start-time — a pid alone could be reused by an unrelated process."""
    me = psutil.Process()
    return f"{socket.gethostname()}:{me.pid}:{me.create_time():.3f}"


def owner_is_gone(label: str) -> bool:
    host, _, rest = label.partition(":")
    pid_text, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False  # another machine's container is not ours to judge
    try:
        return f"{psutil.Process(int(pid_text)).create_time():.3f}" != started
    except psutil.NoSuchProcess:
        return True


def check_unix_endpoint(engine_name: str, endpoint: str) -> None:
    """Fail fast, naming the endpoint, when a local engine socket is missing or refuses."""
    if not endpoint.startswith("unix://"):
        return
    path = endpoint.removeprefix("unix://")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2)
        probe.connect(path)
    except OSError as exc:
        raise CouldNotRunError(f"{engine_name} engine unreachable at {endpoint}: "
                               f"{exc.strerror or exc}", retryable=True) from None
    finally:
        probe.close()


def _socket_owner(endpoint: str) -> int | None:
    """The uid container root maps to: the owner of a local engine socket (rootless podman)."""
    if not endpoint.startswith("unix://"):
        return None
    try:
        return os.stat(endpoint.removeprefix("unix://")).st_uid
    except OSError:
        return None


@dataclass
class ContainerSandbox:
    engine: Engine
    engine_name: str
    image: str
    workspace: str
    hardening: Hardening
    environment: dict[str, str]
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    container: str | None = None
    channel: AgentChannel | None = None
    enforce_limits: bool = False  # the host set limits: refuse a sandbox the engine left unlimited
    pull_policy: PullPolicy = "missing"
    registry_auth: dict[str, str] | None = None  # None: the engine's own credentials
    on_pull_progress: PullCallback | None = None
    mode: Literal["bind", "copy"] = "bind"
    copy_limit: int = DEFAULT_COPY_LIMIT
    keep_group_write: bool = False  # copy mode: group/other write bits come home (not by default)
    copy: WorkspaceCopy | None = None  # copy mode: what the sandbox was given
    last_sync: SyncReport | None = None
    copy_back_error: CouldNotRunError | None = None  # close never raises: kept for the caller
    agent_bundles: dict[str, str] = field(default_factory=dict)  # arch -> bundle dir
    exited: bool = False  # copy mode: the engine reported the container stopped
    _socket_dir: str | None = None
    _workspace_volume: str | None = None
    _agent_stderr: deque[str] | None = None  # copy mode: the engine keeps no log of it

    async def _call(self, func: Callable[[], T]) -> T:
        return await asyncio.to_thread(func)

    async def start(self) -> SandboxInfo:
        started = time.monotonic()
        await self._call(lambda: check_unix_endpoint(self.engine_name, self.engine.endpoint))
        await self._call(self.engine.ping)
        await self.remove_orphans()
        await self._ensure_image()
        labels = {OWNER_LABEL: owner_label(), SESSION_LABEL: self.session_id}
        bundle = await self._call(stage_bundle)
        bundle = select_bundle(await self._call(self._engine_arch), bundle, self.agent_bundles)
        if self.mode == "bind":
            hello = await self._start_bound(bundle, labels)
            # an agent that reports its set-id guard (toolseam_agent/server.py's hello) says so at open;
            # one that does not refuses each command instead (setid_guard "require")
            guard = str(hello.get("setid_guard", ""))
            if guard.startswith("unavailable"):
                raise CouldNotRunError(
                    f"the sandbox's set-id guard is {guard}: in bind mode a command could "
                    f"leave a set-id program in {self.workspace} (docs/security.md); refusing "
                    "to start (copy mode does without it)", retryable=False)
        else:
            hello = await self._start_copied(bundle, labels)
        return SandboxInfo(backend=self.engine_name, workspace=WORKSPACE,
                           base_env=dict(self.environment),
                           pid_namespace=True, agent_pid=int(hello["pid"]),
                           cold_start_ms=int((time.monotonic() - started) * 1000))

    def _spec(self, command: list[str], labels: dict[str, str], **parts: Any) -> ContainerSpec:
        # The agent's own environment (commands get the host's, never this): in bind mode no
        # command may start without the set-id guard — a rootful engine's root writes the host
        # dir directly; in copy mode the copy-back's mode mask is the boundary, the guard a
        # second line (docs/security.md).
        guard = {GUARD_VAR: "require" if self.mode == "bind" else "try"}
        return ContainerSpec(image=self.image, name=f"toolseam-{self.session_id}",
                             command=command, labels=labels,
                             environment={**self.environment, **guard},
                             hardening=self.hardening, **parts)

    async def _start_bound(self, bundle: str, labels: dict[str, str]) -> dict[str, Any]:
        if not os.path.isdir(self.workspace):  # one verdict, before any engine says it its way
            raise CouldNotRunError(f"the workspace {self.workspace} does not exist or is not a "
                                   "directory", retryable=False)
        self._socket_dir = tempfile.mkdtemp(prefix="toolseam-sock-")
        owner = _socket_owner(self.engine.endpoint)
        if os.geteuid() == 0 and owner not in (None, 0):
            os.chown(self._socket_dir, owner, owner)
        os.chmod(self._socket_dir, 0o700)
        command = [*bundle_command(AGENT_MOUNT), "--listen", f"{SOCKET_MOUNT}/agent.sock"]
        spec = self._spec(command, labels, binds=[
            (self.workspace, WORKSPACE, False), (bundle, AGENT_MOUNT, True),
            (self._socket_dir, SOCKET_MOUNT, False)])
        await self._launch(spec)
        return await self._connect()

    async def _launch(self, spec: ContainerSpec, before_start: Callable[[], None] | None = None
                      ) -> None:
        """Create the container, run ``before_start`` (a copy into its volumes), start it, and
        check that the engine applied the limits the host set."""
        self.container = await self._call(lambda: self.engine.create(spec))
        if before_start is not None:
            await self._call(before_start)
        await self._call(lambda: self.engine.start(self.container or ""))
        if self.enforce_limits:
            await self._check_limits(self.container)

    async def _start_copied(self, bundle: str, labels: dict[str, str]) -> dict[str, Any]:
        agent_volume = await self._agent_volume(bundle)
        self._workspace_volume = f"toolseam-ws-{self.session_id}"
        await self._call(lambda: self.engine.create_volume(self._workspace_volume or "", labels))
        spec = self._spec(bundle_command(AGENT_MOUNT), labels, binds=[], stdin_open=True,
                          volumes=[(agent_volume, AGENT_MOUNT, True),
                                   (self._workspace_volume, WORKSPACE, False)])
        self.copy = WorkspaceCopy(self.workspace, self.copy_limit,
                                  keep_group_write=self.keep_group_write)
        await self._launch(spec, before_start=self._copy_in)
        try:
            await self._attach()
        except CouldNotRunError as exc:
            state = await self._state()
            if state is not None and not state.running:
                raise await self.explain(None, starting=True) from None
            raise exc from None
        assert self.channel is not None
        return await self.channel.hello()

    async def _attach(self) -> None:
        assert self.container is not None
        old = self.channel
        self.channel, self._agent_stderr = await attach_channel(
            self.engine.address, self.engine.attach_path(self.container),
            f"{self.engine_name} container {self.container}")
        if old is not None:  # jobs that outlived a dropped stream keep their live output
            self.channel.adopt_listeners(old)

    async def after_drop(self, failure: CouldNotRunError) -> CouldNotRunError:
        """Copy mode: the attach stream closed mid-call. The call's answer is lost either way;
        whether the session is depends on the container, as the engine reports it."""
        state = await self._state()
        if state is not None and not state.running:
            self.exited = True
            return await self.explain(failure)
        where = f"the {self.engine_name} engine at {self.engine.endpoint}"
        if state is None:
            return CouldNotRunError(f"lost the connection to {where} ({failure.reason}); the "
                                    "sandbox may still run: the next call reconnects",
                                    retryable=True)
        return CouldNotRunError(f"the connection to the sandbox through {where} dropped during "
                                f"the call ({failure.reason}); the next call reconnects",
                                retryable=True)

    async def reattach(self) -> None:
        """Copy mode: a new attach stream to the same agent (jobs kept running meanwhile)."""
        state = await self._state()
        if state is None:
            raise CouldNotRunError(f"the {self.engine_name} engine at {self.engine.endpoint} is "
                                   "unreachable; the sandbox may still run", retryable=True)
        if not state.running:
            self.exited = True
            return
        await self._attach()

    def _copy_in(self) -> None:
        assert self.copy is not None and self.container is not None
        with tempfile.TemporaryFile(prefix="toolseam-copy-in-") as archive:
            self.copy.pack(archive)
            archive.seek(0)
            self.engine.put_archive(self.container, WORKSPACE, archive)

    def _engine_arch(self) -> str:
        """Asked once per engine endpoint and process (``info`` is not free)."""
        if self.engine.endpoint not in _ENGINE_ARCH:
            _ENGINE_ARCH[self.engine.endpoint] = self.engine.arch()
        return _ENGINE_ARCH[self.engine.endpoint]

    async def _agent_volume(self, bundle: str) -> str:
        """The bundle in a volume, filled once per engine and bundle (its digest is in the
        name). A second, empty volume marks the fill complete: a fill cut short is redone."""
        name = f"toolseam-agent-{await self._call(lambda: bundle_digest(bundle))}"
        ready = f"{name}-ready"
        if await self._call(lambda: self.engine.volume_exists(ready)):
            return name

        def fill() -> None:
            labels = {AGENT_VOLUME_LABEL: name}
            # Sessions of every process on this host that meet the same empty engine fill it
            # one at a time (the first fills, the others find it ready); an fcntl lock, since
            # they are separate processes. Hosts sharing an engine may still fill it twice:
            # the same bytes, and nobody uses the volume before "-ready" exists.
            key = _digest(self.engine.endpoint + name)
            # The lock lives in this user's staging root: a predictable name in the shared temp
            # dir could be made first by another local user (and held, or made a symlink).
            with open(os.path.join(staging_root(), f"fill-{key}.lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if self.engine.volume_exists(ready):
                    return
                if not self.engine.volume_exists(name):
                    self.engine.create_volume(name, labels)
                helper = self.engine.create(ContainerSpec(
                    image=self.image, name=f"toolseam-fill-{self.session_id}",
                    command=["/opt/toolseam/never-started"], labels=labels, environment={},
                    binds=[], hardening=self.hardening, volumes=[(name, AGENT_MOUNT, False)]))
                try:
                    with bundle_archive(bundle) as archive:
                        self.engine.put_archive(helper, AGENT_MOUNT, archive)
                finally:
                    self.engine.remove(helper)
                self.engine.create_volume(ready, labels)

        await self._call(fill)
        return name

    async def _wait_stopped(self, timeout_s: float = 10.0) -> None:
        """After the agent's shutdown: the archive of a container that is still stopping can
        fail (podman joins the mount namespace of a process that is exiting)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = await self._state()
            if state is None or not state.running:
                return
            await asyncio.sleep(0.05)

    async def sync(self) -> SyncReport:
        """Bring the sandbox's changes to the base dir home (copy mode); bind mode has none."""
        if self.copy is None or self.container is None:
            return SyncReport()
        return await self._call(self._copy_back_retried)

    def _copy_back(self) -> SyncReport:
        assert self.copy is not None and self.container is not None
        source = (f"the {self.engine_name} container {self.container[:12]} (volume "
                  f"{self._workspace_volume})")
        try:
            with self.engine.get_archive(self.container, WORKSPACE) as chunks:
                spool = self.copy.spool(chunks, "the sandbox's workspace")
            with spool:
                return self.copy.apply(spool, source=source)
        except (tarfile.TarError, EOFError) as exc:
            # an archive the engine cut short (a file changing while it is read); the copy
            # applies all or nothing, so asking again is safe
            raise CouldNotRunError(f"the {self.engine_name} engine's archive of the sandbox's "
                                   f"workspace was unreadable ({type(exc).__name__}: {exc}); "
                                   "nothing was copied back", retryable=True) from None

    def _copy_back_retried(self) -> SyncReport:
        """A copy-back, asked again (bounded) while it fails in a way that may pass: an archive
        read while a build writes can come back cut short."""
        return transient_retry(self._copy_back,
                               lambda e: isinstance(e, CouldNotRunError) and e.retryable)

    async def _ensure_image(self) -> None:
        """The image, by the pull policy: never pulled, pulled when missing, or always."""
        if self.pull_policy != "always" and await self._call(
                lambda: self.engine.image_exists(self.image)):
            return
        if self.pull_policy == "never":
            raise CouldNotRunError(
                f"image {self.image!r} is not present on the {self.engine_name} engine at "
                f"{self.engine.endpoint} (pull policy: never)", retryable=False)
        await self._call(lambda: self.engine.pull(self.image, self.registry_auth,
                                                  self.on_pull_progress))

    async def _check_limits(self, container: str) -> None:
        """The engine's own record must show the limits: rootless podman on cgroups v1, for
        one, accepts them and then ignores them ("Resource limits are not supported")."""
        host = await self._call(lambda: self.engine.host_config(container))
        h = self.hardening
        missing = []
        if host.get("Memory") != size_bytes(h.memory):
            missing.append(f"memory={h.memory}")
        if host.get("PidsLimit") != h.pids_limit:
            missing.append(f"pids={h.pids_limit}")
        if h.cpus is not None:
            quota, period = host.get("CpuQuota") or 0, host.get("CpuPeriod") or 0
            applied = (host.get("NanoCpus") or 0) / 1e9 or (quota / period if period else 0)
            if abs(applied - h.cpus) > 1e-6:
                missing.append(f"cpus={h.cpus:g}")
        if missing:
            raise CouldNotRunError(
                f"the {self.engine_name} engine at {self.engine.endpoint} did not apply the "
                f"limits {', '.join(missing)} (rootless podman ignores resource limits on "
                "cgroups v1); refusing an unlimited sandbox", retryable=False)

    async def _connect(self) -> dict[str, Any]:
        assert self._socket_dir is not None
        path = os.path.join(self._socket_dir, "agent.sock")
        deadline = time.monotonic() + _CONNECT_TIMEOUT_S
        delay = 0.002
        while True:
            if os.path.exists(path):
                try:
                    self.channel = await AgentChannel.connect(
                        path, f"{self.engine_name} container {self.container}")
                    break
                except OSError:
                    pass
            state = await self._state()
            if state is not None and not state.running:
                raise await self.explain(None, starting=True)
            if time.monotonic() > deadline:
                raise CouldNotRunError(f"the sandbox agent did not start within {_CONNECT_TIMEOUT_S:.0f} s "
                                       f"in {self.image!r}", retryable=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        return await self.channel.hello()

    async def _state(self) -> ContainerState | None:
        if self.container is None:
            return None
        try:
            return await self._call(lambda: self.engine.state(self.container or ""))
        except CouldNotRunError:
            return None

    async def explain(self, failure: CouldNotRunError | None, starting: bool = False
                      ) -> CouldNotRunError:
        """Turn "the channel closed" into what happened to the container, from the engine's API."""
        state = await self._state()
        if state is None:
            return failure or CouldNotRunError("the sandbox container is gone", retryable=True)
        logs = ""
        with contextlib.suppress(CouldNotRunError):
            logs = (await self._call(lambda: self.engine.logs(self.container or ""))).strip()
        if not logs and self._agent_stderr:
            logs = "\n".join(self._agent_stderr)
        if state.running:
            detail = f": {logs.splitlines()[-1]}" if logs else ""
            return CouldNotRunError(f"the sandbox agent crashed; its container still runs{detail}",
                                    retryable=True)
        if self.mode == "copy" and state.exit_code == 0 and not starting:
            return CouldNotRunError(
                "the sandbox ended when its attach stream closed: the engine closed the "
                "agent's input (podman does whenever an attach ends, even on a dropped "
                "connection); its changes come home at close", retryable=False)
        if starting and state.exit_code not in (137, None):
            # The agent brings its own runtime: an exit at start is the agent's own failure
            # (an image for another CPU architecture, a kernel without what it needs).
            detail = logs.splitlines()[-1] if logs else f"exit code {state.exit_code}"
            return CouldNotRunError(f"the sandbox agent could not start in image {self.image!r}: "
                                    f"{detail}", retryable=False)
        if state.oom_killed or state.exit_code == 137:
            # podman 4.3 reports OOMKilled=false for a real OOM kill: exit 137 says SIGKILL.
            return CouldNotRunError("the sandbox container was killed (out of memory or SIGKILL, "
                                    "exit 137)", retryable=True)
        return CouldNotRunError(f"the sandbox container exited (code {state.exit_code}, "
                                f"{state.status})", retryable=True)

    async def remove_orphans(self) -> list[str]:
        """The janitor: remove containers and volumes whose owning process is gone — except
        work kept after a failed copy-back, which stays until the user removes it
        (``toolseam recover --remove``) or ``KEPT_RETENTION_S`` has passed."""
        return await self._call(lambda: janitor(self.engine))

    async def stop(self) -> None:
        """End the session. In copy mode the changes come home first, after the agent has
        ended every job (the archive API reads a stopped container as well). If they cannot
        come home, the container and its volume are kept and ``copy_back_error`` names them
        (``Toolkit.close`` raises it)."""
        try:
            await self._stop()
        finally:  # whatever failed above: no engine client (an ssh tunnel) outlives the session
            await self._call(self.engine.close)

    async def _stop(self) -> None:
        channel, self.channel = self.channel, None
        if channel is not None:
            await channel.shutdown(drain_s=5)
        if self.copy is not None and self.container is not None:
            try:
                await self._wait_stopped()
                self.last_sync = await self._call(self._copy_back_retried)
            except Exception as exc:  # noqa: BLE001 - any failure keeps the work, and says so
                reason = exc.reason if isinstance(exc, CouldNotRunError) else \
                    f"{type(exc).__name__}: {exc}"
                self.copy_back_error = CouldNotRunError(
                    f"the sandbox's changes were not copied back to {self.workspace}: "
                    f"{reason}. {await self._keep()}", retryable=False)
                self.container = self._workspace_volume = self.copy = None
        if self.container is not None:
            with contextlib.suppress(CouldNotRunError):
                await self._call(lambda: self.engine.remove(self.container or ""))
            self.container = None
        if self._workspace_volume is not None:
            with contextlib.suppress(CouldNotRunError):
                await self._call(lambda: self.engine.remove_volume(self._workspace_volume or ""))
            self._workspace_volume = None
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    async def _keep(self) -> str:
        """Mark the container and its workspace volume kept; the sentence that says how to
        get the work out."""
        from .recover import recover_command

        container, volume = self.container or "", self._workspace_volume or ""
        labels = {KEPT_LABEL: str(int(time.time())), KEPT_CONTAINER_LABEL: container,
                  KEPT_VOLUME_LABEL: volume, KEPT_WORKSPACE_LABEL: self.workspace,
                  SESSION_LABEL: self.session_id}
        try:
            await self._call(lambda: self.engine.create_volume(
                f"toolseam-kept-{self.session_id}", labels))
            kept = f"kept for {KEPT_RETENTION_S // 86400} days"
        except CouldNotRunError as exc:
            kept = (f"not removed, but could not be marked kept ({exc.reason}): the next "
                    "session's janitor may remove them, recover now")
        command = recover_command(self.engine_name, self.engine.endpoint, container)
        return (f"The container {container[:12]} and its workspace volume are {kept}. Recover "
                f"the work with: {command} --to DIR   (then: {command} --remove)")


def _kept_sessions(engine: Engine, now: float) -> tuple[set[str], list[tuple[str, dict[str, str]]]]:
    """Sessions whose work is kept and within retention; the markers past it."""
    kept, expired = set(), []
    for marker, labels in engine.labeled_volumes(KEPT_LABEL):
        try:
            since = float(labels.get(KEPT_LABEL, ""))
        except ValueError:
            since = 0.0  # unreadable: treated as old
        if now - since > KEPT_RETENTION_S:
            expired.append((marker, labels))
        else:
            kept.add(labels.get(SESSION_LABEL, ""))
    return kept, expired


def janitor(engine: Engine, now: float | None = None) -> list[str]:
    """Remove containers and volumes whose owner process is gone, unless their session's work
    is kept; and kept work past its retention. Returns the containers removed."""
    kept, expired = _kept_sessions(engine, time.time() if now is None else now)
    removed = []
    for marker, labels in expired:
        with contextlib.suppress(CouldNotRunError):
            container = labels.get(KEPT_CONTAINER_LABEL, "")
            if container:
                engine.remove(container)
                removed.append(container)
            if labels.get(KEPT_VOLUME_LABEL):
                engine.remove_volume(labels[KEPT_VOLUME_LABEL])
            engine.remove_volume(marker)
    for container, labels in engine.labeled(OWNER_LABEL):
        if labels.get(SESSION_LABEL) not in kept and owner_is_gone(labels.get(OWNER_LABEL, "")):
            with contextlib.suppress(CouldNotRunError):
                engine.remove(container)
                removed.append(container)
    for volume, labels in engine.labeled_volumes(OWNER_LABEL):
        if labels.get(SESSION_LABEL) not in kept and owner_is_gone(labels.get(OWNER_LABEL, "")):
            with contextlib.suppress(CouldNotRunError):
                engine.remove_volume(volume)
    return removed
