"""What the podman and docker backends share, by composition: one warm container per session.

The container runs the sandbox agent (the staged bundle of ``bundle.stage_bundle``) as its main
process: pid 1 of the container, which no command can kill. Every call is a line on one
channel to it — about a millisecond, never an engine ``exec`` per call. Two ways to get there,
each a mode object chosen once (``backend.MODES``): ``containers/bind.py`` (a local
engine: bind mounts, a unix socket) and ``containers/copy.py`` (an engine on another machine:
the base dir copied in and back, the engine's attach stream). ``ContainerSandbox`` holds the
lifecycle they share; the ``Engine`` protocol is what the sandbox asks of an engine
(``containers/engine.py:SdkEngine`` implements it once, over a dialect per SDK).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
import shlex
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Literal, Protocol, TypeVar

import psutil

from toolseam_agent.landlock import DOMAIN_VAR
from toolseam_agent.setid_guard import MODE_VAR as GUARD_VAR

from ...policy.limits import SandboxLimits, size_bytes
from ...seam.errors import CouldNotRunError
from ...seam.models import SandboxInfo, SyncReport
from ..agentlink.channel import AgentChannel
from ..composed import Liveness
from ..owner import still_runs
from .attach import EngineAddress
from .bundle import stage_bundle
from .bundle_arch import select_bundle
from .pull import PullCallback, PullPolicy

OWNER_LABEL = "toolseam.owner"
SESSION_LABEL = "toolseam.session"
# A session that outlives its client (containers/durable_*.py): no owner label (any process
# may attach; its agent ends it after its orphan timeout); the janitor removes it once stopped.
DURABLE_LABEL = "toolseam.orphan_timeout_s"
WORKSPACE = "/workspace"
AGENT_MOUNT = "/opt/toolseam"
SOCKET_MOUNT = "/run/toolseam"
AGENT_VOLUME_LABEL = "toolseam.agent"
# Work kept after a failed copy-back: engines cannot relabel a container or volume, so a
# marker volume carries the labels (no owner label: no janitor takes it for an orphan).
# A durable session being closed (a volume with the closing process as owner): its stopped
# container is the closing client's copy-back source, not a session that ended by itself.
CLOSING_LABEL = "toolseam.closing"
KEPT_LABEL = "toolseam.kept"  # unix time it was kept
KEPT_CONTAINER_LABEL = "toolseam.kept.container"
KEPT_VOLUME_LABEL = "toolseam.kept.volume"
KEPT_WORKSPACE_LABEL = "toolseam.kept.workspace"  # the host dir the work was going to
KEPT_RETENTION_S = 7 * 24 * 3600  # then the janitor removes it (docs/containers.md)
WorkspaceMode = Literal["auto", "bind", "copy"]
WORKSPACE_MODES: tuple[WorkspaceMode, ...] = ("auto", "bind", "copy")
_CONNECT_TIMEOUT_S = 15.0

POOL_LABEL = "toolseam.pool"  # the SandboxPool a pre-warmed sandbox belongs to (pool.py)
T = TypeVar("T")
_ENGINE_ARCH: dict[str, str] = {}
_ENGINE_ARCH_LOCKS: dict[str, threading.Lock] = {}
# Engine calls block (the SDKs are synchronous): they run in threads of their own. asyncio's
# default executor has min(32, CPUs + 4) threads — 6 on a 2-CPU machine — and 16 sessions
# opening at once queued behind it (docs/pool.md, decision 113); an idle thread costs nothing.
_ENGINE_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=64,
                                                        thread_name_prefix="toolseam-engine")
# One janitor pass per engine at a time: sessions opening together share the pass under way
# instead of each listing every container and volume (decision 113).
_JANITORS: dict[str, asyncio.Future[list[str]]] = {}


async def in_engine_thread(func: Callable[[], T]) -> T:
    """Run a blocking engine call in the engine threads."""
    return await asyncio.get_running_loop().run_in_executor(_ENGINE_THREADS, func)


@dataclass(frozen=True)
class Hardening:
    """The sandbox's defaults (CONTRACT §9); every one can be overridden by the host. What it
    may use (memory, CPUs, processes, network, /tmp) is the one limits type, ``SandboxLimits``:
    written once, here and in settings alike."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    read_only_root: bool = True
    drop_all_capabilities: bool = True
    no_new_privileges: bool = True
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
    # container paths of binds that receive mounts the host makes below them later (slave
    # propagation): a pool's slot, onto which the base dir is mounted at hand-out
    slave_binds: tuple[str, ...] = ()
    auto_remove: bool = False  # the engine removes it when it stops (a durable session's)


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
        return not still_runs(int(pid_text), float(started))
    except ValueError:
        return True  # a label of ours with no start time: its maker cannot be told apart


async def adopt_running(sandbox: ContainerSandbox, container: str) -> None:
    """Take ``container`` as this sandbox's, for an attach (``durable_*.py``): it must still be
    there and running, else ``AttachError`` saying the session ended."""
    from ...seam.handle import AttachError

    sandbox.container = container
    state = await sandbox.state()
    where = f"the {sandbox.engine_name} engine at {sandbox.engine.endpoint}"
    if state is None:
        raise AttachError("gone", f"{where} has no container {container[:12]}: the session "
                          "ended (closed, or orphaned past its orphan_timeout_s)")
    if not state.running:
        raise AttachError("ended", f"container {container[:12]} on {where} has stopped "
                          f"({state.status}): the session ended")


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


class WorkspaceModeImpl(Protocol):
    """How the sandbox gets its workspace and its channel: ``containers/bind.py`` or
    ``containers/copy.py``, chosen once (``backend.MODES``)."""

    @property
    def name(self) -> Literal["bind", "copy"]: ...
    @property
    def guard(self) -> str: ...  # the agent's set-id guard setting (toolseam_agent/setid_guard.py)
    @property
    def shares_host_dir(self) -> bool: ...  # the host dir itself, not a copy (bind mode)
    last_sync: SyncReport | None  # what the last copy-back brought home
    copy_back_error: CouldNotRunError | None  # close could not bring the work home
    agent_stderr: deque[str] | None  # the agent's stderr, where the engine keeps no log

    def liveness(self, sandbox: ContainerSandbox) -> Liveness: ...
    async def start(self, sandbox: ContainerSandbox, bundle: str, labels: dict[str, str]
                    ) -> dict[str, Any]: ...
    def exit_reason(self, exit_code: int | None) -> str | None: ...
    def pack_upload(self, local: str, name: str, archive: IO[bytes]) -> None: ...
    def uploaded(self, archive: str, parent: str) -> None: ...
    async def adopt(self, sandbox: ContainerSandbox, workspace: str) -> None: ...
    async def sync(self, sandbox: ContainerSandbox) -> SyncReport: ...
    async def closing(self, sandbox: ContainerSandbox) -> None: ...  # before the agent's shutdown
    async def finish(self, sandbox: ContainerSandbox) -> None: ...
    async def clean_up(self, sandbox: ContainerSandbox) -> None: ...


@dataclass
class ContainerSandbox:
    """The lifecycle both modes share: engine checks, image, bundle, the container's spec,
    launch and limits, what happened to it, the janitor and the end of the session."""

    engine: Engine
    engine_name: str
    image: str
    workspace: str
    hardening: Hardening
    environment: dict[str, str]
    mode: WorkspaceModeImpl
    session_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    container: str | None = None
    channel: AgentChannel | None = None
    enforce_limits: bool = False  # the host set limits: refuse a sandbox the engine left unlimited
    pull_policy: PullPolicy = "missing"
    registry_auth: dict[str, str] | None = None  # None: the engine's own credentials
    on_pull_progress: PullCallback | None = None
    agent_bundles: dict[str, str] = field(default_factory=dict)  # arch -> bundle dir
    started: bool = False  # open succeeded
    # A pool's pre-warmed sandbox (pool.py): started without the workspace, which arrives
    # at hand-out (``adopt``); its labels name the pool.
    awaiting_workspace: bool = False
    extra_labels: dict[str, str] = field(default_factory=dict)

    @property
    def last_sync(self) -> SyncReport | None:
        return self.mode.last_sync

    @property
    def copy_back_error(self) -> CouldNotRunError | None:
        return self.mode.copy_back_error

    async def _call(self, func: Callable[[], T]) -> T:
        return await in_engine_thread(func)

    async def start(self) -> SandboxInfo:
        started = time.monotonic()
        await self._call(lambda: check_unix_endpoint(self.engine_name, self.engine.endpoint))
        await self._call(self.engine.ping)
        await self.remove_orphans()
        await self._ensure_image()
        labels = {**self.extra_labels, OWNER_LABEL: owner_label(),
                  SESSION_LABEL: self.session_id}
        bundle = await self._call(stage_bundle)
        bundle = select_bundle(await self._call(self._engine_arch), bundle, self.agent_bundles)
        hello = await self.mode.start(self, bundle, labels)
        self.started = True
        return SandboxInfo(backend=self.engine_name, workspace=WORKSPACE,
                           base_env=dict(self.environment),
                           pid_namespace=True, agent_pid=int(hello["pid"]),
                           cold_start_ms=int((time.monotonic() - started) * 1000))

    async def adopt(self, workspace: str) -> None:
        """A pre-warmed sandbox takes its session's workspace (the pool's hand-out)."""
        if not self.awaiting_workspace or not self.started:
            raise CouldNotRunError("this sandbox was not started to await a workspace",
                                   retryable=False)
        await self.mode.adopt(self, workspace)
        self.awaiting_workspace = False

    def spec(self, command: list[str], labels: dict[str, str], **parts: Any) -> ContainerSpec:
        """The session's container: the agent's own environment (commands get the host's,
        never this) carries the mode's set-id guard setting, and asks for the commands' Landlock
        domain (``toolseam_agent/landlock.py``): no command traces or signals the agent or a
        relay, or connects to the agent's abstract socket."""
        return ContainerSpec(image=self.image, name=f"toolseam-{self.session_id}",
                             command=command, labels=labels,
                             environment={**self.environment, GUARD_VAR: self.mode.guard,
                                          DOMAIN_VAR: "scope"},
                             hardening=self.hardening, **parts)

    async def launch(self, spec: ContainerSpec, before_start: Callable[[], None] | None = None
                     ) -> None:
        """Create the container, run ``before_start`` (a copy into its volumes), start it, and
        check that the engine applied the limits the host set."""
        made = asyncio.ensure_future(self._call(lambda: self.engine.create(spec)))
        try:
            self.container = await asyncio.shield(made)
        except asyncio.CancelledError:
            # cancelled while the engine creates it (a pool closing): learn its id anyway, so
            # stop() removes it instead of leaving it to a later janitor
            with contextlib.suppress(Exception):
                self.container = await made
            raise
        if before_start is not None:
            await self._call(before_start)
        await self._call(lambda: self.engine.start(self.container or ""))
        if self.enforce_limits:
            await self._check_limits(self.container)

    def _engine_arch(self) -> str:
        """Asked once per engine endpoint and process (``info`` is not free: podman's took
        2.6 s with 16 sessions asking at once, so the others wait for the first)."""
        with _ENGINE_ARCH_LOCKS.setdefault(self.engine.endpoint, threading.Lock()):
            if self.engine.endpoint not in _ENGINE_ARCH:
                _ENGINE_ARCH[self.engine.endpoint] = self.engine.arch()
        return _ENGINE_ARCH[self.engine.endpoint]

    async def sync(self) -> SyncReport:
        """Bring the sandbox's changes to the base dir home (copy mode); bind mode has none."""
        return await self.mode.sync(self)

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
        h = self.hardening.limits
        missing = []
        if host.get("Memory") != size_bytes(h.memory):
            missing.append(f"memory={h.memory}")
        if host.get("PidsLimit") != h.pids:
            missing.append(f"pids={h.pids}")
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

    async def state(self) -> ContainerState | None:
        if self.container is None:
            return None
        try:
            return await self._call(lambda: self.engine.state(self.container or ""))
        except CouldNotRunError:
            return None

    async def explain(self, failure: CouldNotRunError | None, starting: bool = False
                      ) -> CouldNotRunError:
        """Turn "the channel closed" into what happened to the container, from the engine's API
        — unless the channel ended on a line that did not hold its seal: that is what happened."""
        if failure is not None and self.channel is not None and self.channel.tampered:
            return failure
        state = await self.state()
        if state is None:
            return failure or CouldNotRunError("the sandbox container is gone", retryable=True)
        logs = ""
        with contextlib.suppress(CouldNotRunError):
            logs = (await self._call(lambda: self.engine.logs(self.container or ""))).strip()
        if not logs and self.mode.agent_stderr:
            logs = "\n".join(self.mode.agent_stderr)
        if state.running:
            detail = f": {logs.splitlines()[-1]}" if logs else ""
            return CouldNotRunError(f"the sandbox agent crashed; its container still runs{detail}",
                                    retryable=True)
        reason = None if starting else self.mode.exit_reason(state.exit_code)
        if reason is not None:
            return CouldNotRunError(reason, retryable=False)
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
        (``toolseam recover --remove``) or ``KEPT_RETENTION_S`` has passed. Sessions opening
        together share one pass per engine."""
        running = _JANITORS.get(self.engine.endpoint)
        if running is not None and not running.done() and \
                running.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(Exception):  # a pass whose session went away: run our own
                return await asyncio.shield(running)
        task = asyncio.ensure_future(self._call(lambda: janitor(self.engine)))
        task.add_done_callback(lambda done: done.cancelled() or done.exception())
        _JANITORS[self.engine.endpoint] = task
        try:
            return await asyncio.shield(task)
        finally:
            if _JANITORS.get(self.engine.endpoint) is task and task.done():
                del _JANITORS[self.engine.endpoint]

    async def stop(self) -> None:
        """End the session: the agent ends every job, the mode finishes (copy mode brings the
        changes home, or keeps the container and says so in ``copy_back_error``), the
        container goes, then what the mode made for it."""
        try:
            await self._stop()
        finally:  # whatever failed above: no engine client (an ssh tunnel) outlives the session
            await self._call(self.engine.close)

    async def _stop(self) -> None:
        channel, self.channel = self.channel, None
        if channel is not None:
            await self.mode.closing(self)
            await channel.shutdown(drain_s=5)
        await self.mode.finish(self)
        if self.container is not None:
            with contextlib.suppress(CouldNotRunError):
                await self._call(lambda: self.engine.remove(self.container or ""))
            self.container = None
        await self.mode.clean_up(self)


def recover_command(engine_name: str, endpoint: str, container: str) -> str:
    """The command line that names this kept container on this engine."""
    backend = "docker" if engine_name.startswith("docker") else "podman"
    rootless = " --rootless" if engine_name == "podman-rootless" else ""
    return (f"toolseam recover --backend {backend}{rootless} --endpoint {shlex.quote(endpoint)} "
            f"{container[:12]}")


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


_ENDED = ("exited", "stopped", "dead")  # not "created": a session may be starting it


def _state(engine: Engine, container: str) -> ContainerState | None:
    try:
        return engine.state(container)
    except CouldNotRunError:
        return None


def janitor(engine: Engine, now: float | None = None) -> list[str]:
    """Remove containers and volumes whose owner process is gone, unless their session's work
    is kept; and kept work past its retention; and the host mounts of pools whose process is
    gone (``pool_mounts``), and socket directories no agent listens in (``bind``). Returns the
    containers removed."""
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
    durable = set()  # sessions that outlive their client, still running: their agents end them
    owned_volumes = engine.labeled_volumes(OWNER_LABEL)  # closing markers among them
    closing = {labels.get(SESSION_LABEL) for _, labels in owned_volumes
               if CLOSING_LABEL in labels and not owner_is_gone(labels.get(OWNER_LABEL, ""))}
    for container, labels in engine.labeled(DURABLE_LABEL):  # no owner: any client may attach
        state = _state(engine, container)
        if state is not None and state.running:
            durable.add(labels.get(SESSION_LABEL))
        elif labels.get(SESSION_LABEL) in closing:
            continue  # stopped by a live client that is copying its work home from it
        elif state is not None and state.status in _ENDED:  # ended itself (its orphan timeout)
            with contextlib.suppress(CouldNotRunError):
                engine.remove(container)
                removed.append(container)
    for container, labels in engine.labeled(OWNER_LABEL):
        if labels.get(SESSION_LABEL) not in kept and owner_is_gone(labels.get(OWNER_LABEL, "")):
            with contextlib.suppress(CouldNotRunError):
                engine.remove(container)
                removed.append(container)
    for volume, labels in owned_volumes:
        if labels.get(SESSION_LABEL) in durable:  # podman's forced removal takes its container
            continue
        if labels.get(SESSION_LABEL) not in kept and owner_is_gone(labels.get(OWNER_LABEL, "")):
            with contextlib.suppress(CouldNotRunError):
                engine.remove_volume(volume)
    from .bind import sweep_socket_dirs  # bind.py imports this module
    from .pool_mounts import sweep_dead_pools  # it reads the owner labels of this module
    sweep_dead_pools()
    sweep_socket_dirs()
    return removed
