"""What the podman and docker backends share, by composition: one warm container per session.

The container runs the sandbox agent (the staged bundle of ``bundle.stage_bundle``) as its main
process: pid 1 of the container, which no command can kill. Every call is a line on one
channel to it — about a millisecond, never an engine ``exec`` per call. Two ways to get there,
each a mode object chosen once (``backend.MODES``): ``modes/bind.py`` (a local
engine: bind mounts, a unix socket) and ``modes/copy.py`` (an engine on another machine:
the base dir copied in and back, the engine's attach stream). ``ContainerSandbox`` holds the
lifecycle they share; the ``Engine`` protocol is what the sandbox asks of an engine
(``engine/sdk.py:SdkEngine`` implements it once, over a dialect per SDK).
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Literal, Protocol, TypeVar

from toolseam_agent.landlock import DOMAIN_VAR
from toolseam_agent.setid_guard import MODE_VAR as GUARD_VAR

from ...policy.limits import size_bytes
from ...seam.errors import CouldNotRunError
from ...seam.handle import AttachError, SessionHandle
from ...seam.models import SandboxInfo, SyncReport
from ..agentlink.channel import AgentChannel
from ..agentlink.durable import Connector
from ..composed import Liveness
from .bundle.foreign_arch import select_bundle
from .bundle.staged import stage_bundle
from .engine.errors import EngineNotFound
from .engine.protocol import ContainerSpec, ContainerState, Engine, Hardening, in_engine_thread
from .engine.pull import PullCallback, PullPolicy
from .host_dirs import check_workspace
from .janitor import shared_pass
from .labels import OWNER_LABEL, SESSION_LABEL, WORKSPACE, owner_label

WorkspaceMode = Literal["auto", "bind", "copy"]
WORKSPACE_MODES: tuple[WorkspaceMode, ...] = ("auto", "bind", "copy")
_CONNECT_TIMEOUT_S = 15.0
REMOVED = "removed"  # ContainerState.status of a container the engine no longer knows
_SETTLE_S = 5.0  # how long a container whose agent died may still be reported running

T = TypeVar("T")
_ENGINE_ARCH: dict[str, str] = {}
_ENGINE_ARCH_LOCKS: dict[str, threading.Lock] = {}


async def adopt_running(sandbox: ContainerSandbox, container: str) -> None:
    """Take ``container`` as this sandbox's, for an attach (``lifetime.adopt``): it must still be
    there and running, else ``AttachError`` saying the session ended."""
    sandbox.container = container
    state = await sandbox.state()
    where = f"the {sandbox.engine_name} engine at {sandbox.engine.endpoint}"
    if state is None or state.status == REMOVED:
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
                               f"{exc.strerror or exc}{_root_rootless_hint(engine_name, path)}",
                               retryable=True,
                               cause="engine_unreachable") from None
    finally:
        probe.close()


def _root_rootless_hint(engine_name: str, path: str) -> str:
    """Root has no rootless engine of its own (``/run/user/0``): rootless podman is another
    user's, reached by naming that user's socket."""
    if engine_name != "podman-rootless" or not path.startswith("/run/user/0/"):
        return ""
    return ("; running as root, rootless podman is another user's engine: name that user's "
            "socket with endpoint='unix:///run/user/UID/podman/podman.sock' or the "
            "TOOLSEAM_PODMAN_ROOTLESS_URL variable")


class ContainerLifetime(Protocol):
    """How long the sandbox lives — ``lifetimes/ephemeral.py`` or ``lifetimes/durable.py``,
    chosen once with the backend (``backend.LIFETIMES``) — as the hooks a workspace mode asks
    of it: the agent's arguments, the spec, the channel, letting go of it, the kept state, and
    the session to attach to. A mode never asks which lifetime it has."""

    @property
    def outlives_client(self) -> bool: ...  # clients come and go: the agent listens, no owner
    @property
    def adopt(self) -> SessionHandle | None: ...  # an attach: the running session to take
    def agent_args(self, address: str) -> list[str]: ...  # how the agent listens at address
    def finish_spec(self, spec: ContainerSpec, *, removed_when_stopped: bool
                    ) -> ContainerSpec: ...  # labels, the agent's environment
    async def open_channel(self, address: str, endpoint: str,
                           connector: Connector | None = None) -> AgentChannel: ...
    async def let_go(self, channel: AgentChannel | None) -> None: ...  # the agent goes on
    async def keep(self, channel: AgentChannel | None, part: str, state: Any) -> bool: ...
    def kept(self, channel: AgentChannel | None, part: str) -> Any: ...


class WorkspaceModeImpl(Protocol):
    """How the sandbox gets its workspace and its channel: ``modes/bind.py`` or
    ``modes/copy.py``, chosen once (``backend.MODES``); how long it lives is the sandbox's
    ``lifetime``, whose hooks the mode calls."""

    @property
    def name(self) -> Literal["bind", "copy"]: ...
    @property
    def guard(self) -> str: ...  # the agent's set-id guard setting (toolseam_agent/setid_guard.py)
    @property
    def shares_host_dir(self) -> bool: ...  # the host dir itself, not a copy (bind mode)
    last_sync: SyncReport | None  # what the last copy-back brought home
    copy_back_error: CouldNotRunError | None  # close could not bring the work home
    agent_stderr: deque[str] | None  # the agent's stderr, where the engine keeps no log
    @property
    def address(self) -> str: ...  # where a client reaches a listening agent ("" before)

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
    async def detach(self, sandbox: ContainerSandbox) -> None: ...  # the sandbox goes on
    async def keep_state(self, sandbox: ContainerSandbox) -> None: ...  # what a later close needs


def fresh_session_id() -> str:
    """A container session's id: part of its container's and volumes' names."""
    return uuid.uuid4().hex[:12]


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
    lifetime: ContainerLifetime
    session_id: str = field(default_factory=fresh_session_id)
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
        if not self.awaiting_workspace:  # the host's typo, said before any engine is asked
            check_workspace(self.workspace)
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
        return SandboxInfo(backend=self.engine_name, workspace=WORKSPACE, image=self.image,
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
                f"{self.engine.endpoint} (pull policy: never); {self._how_to_load()}",
                retryable=False, cause="image_missing")
        try:
            await self._call(lambda: self.engine.pull(self.image, self.registry_auth,
                                                      self.on_pull_progress))
        except CouldNotRunError as exc:
            if self.pull_policy == "always" or type(exc) is not CouldNotRunError:
                raise  # an engine that is down says so itself
            # the pull was only tried because the image is missing: say that first
            raise CouldNotRunError(
                f"image {self.image!r} is not present on the {self.engine_name} engine at "
                f"{self.engine.endpoint}, and pulling it failed ({exc}); "
                f"{self._how_to_load()}", retryable=exc.retryable,
                cause="image_missing") from None

    def _how_to_load(self) -> str:
        """What a user without a registry does: load or build the image into this engine."""
        tool = "docker -H" if self.engine_name.startswith("docker") else "podman --url"
        engine = f"{tool} {shlex.quote(self.engine.endpoint)}"
        return (f"load it ({engine} load -i IMAGE.tar) or build it ({engine} build -t "
                f"{shlex.quote(self.image)} DIR) into this engine")

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
                "cgroups v1); refusing an unlimited sandbox", retryable=False, cause="refused")

    async def state(self) -> ContainerState | None:
        """The container's state; ``status`` "removed" when the engine no longer knows it,
        None when the engine could not be asked."""
        if self.container is None:
            return None
        try:
            return await self._call(lambda: self.engine.state(self.container or ""))
        except EngineNotFound:  # removed from outside: as dead as a stopped one
            return ContainerState(running=False, exit_code=None, oom_killed=False,
                                  status=REMOVED)
        except CouldNotRunError:
            return None

    async def explain(self, failure: CouldNotRunError | None, starting: bool = False
                      ) -> CouldNotRunError:
        """Turn "the channel closed" into what happened to the container, from the engine's API
        — unless the channel ended on a line that did not hold its seal: that is what happened."""
        if failure is not None and self.channel is not None and self.channel.tampered:
            return failure
        state = await (self.state() if starting else self._settled_state())
        if state is None:
            return failure or CouldNotRunError("the sandbox container is gone", retryable=True,
                                               cause="sandbox_lost")
        if state.status == REMOVED:
            return CouldNotRunError(f"the sandbox container {self.container} was removed from "
                                    f"the {self.engine_name} engine", retryable=True,
                                    cause="sandbox_lost")
        logs = ""
        with contextlib.suppress(CouldNotRunError):
            logs = (await self._call(lambda: self.engine.logs(self.container or ""))).strip()
        if not logs and self.mode.agent_stderr:
            logs = "\n".join(self.mode.agent_stderr)
        if state.running:
            detail = f": {logs.splitlines()[-1]}" if logs else ""
            return CouldNotRunError(f"the sandbox agent crashed; its container still runs{detail}",
                                    retryable=True, cause="agent_failed")
        reason = None if starting else self.mode.exit_reason(state.exit_code)
        if reason is not None:
            return CouldNotRunError(reason, retryable=False, cause="sandbox_lost")
        if starting and state.exit_code not in (137, None):
            # The agent brings its own runtime: an exit at start is the agent's own failure
            # (an image for another CPU architecture, a kernel without what it needs).
            detail = logs.splitlines()[-1] if logs else f"exit code {state.exit_code}"
            return CouldNotRunError(f"the sandbox agent could not start in image {self.image!r}: "
                                    f"{detail}", retryable=False, cause="agent_failed")
        if state.oom_killed or state.exit_code == 137:
            # podman 4.3 reports OOMKilled=false for a real OOM kill: exit 137 says SIGKILL.
            return CouldNotRunError("the sandbox container was killed (out of memory or SIGKILL, "
                                    "exit 137)", retryable=True, cause="sandbox_lost")
        return CouldNotRunError(f"the sandbox container exited (code {state.exit_code}, "
                                f"{state.status})", retryable=True, cause="sandbox_lost")

    async def _settled_state(self) -> ContainerState | None:
        """The container's state once it is not mid-way through ending. The agent is the
        container's first process: when its channel died, the engine may still report the
        container running for a moment while it stops or removes it (docker's ``rm -f`` did,
        and the reason said "its container still runs") — so ask again, a bounded while."""
        state = await self.state()
        deadline = time.monotonic() + _SETTLE_S
        while state is not None and state.running and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            state = await self.state()
        return state

    async def remove_orphans(self) -> list[str]:
        """The janitor (``janitor.py``): containers, volumes and host directories whose owner
        is gone. Sessions opening together share one pass per engine."""
        return await shared_pass(self.engine, self._call)

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
