"""The host backend: files on this machine, in-process; commands through a per-session agent.

File operations call the agent's code directly (a read costs an ``open`` and a ``read``, no
hop). Commands go to one long-lived agent process per session, started in a private pid
namespace (``unshare --pid --fork --mount-proc``; ``--user --map-current-user`` when not root):

* commands cannot see the host's processes, so no ``/proc/<ancestor>/environ`` leaks the
  host's secrets — the agent (pid 1 there) was started with an empty environment;
* nor uncover them: the agent then enters a user namespace of its own (``toolseam_agent/userns.py``)
  whose mounts are locked, so not even a root host's commands can unmount that ``/proc``;
* every orphan (``setsid``, double fork) is re-parented to the agent, which kills whole jobs;
* when the host dies, the channel closes, the agent kills every job, and the kernel kills
  whatever is left in the namespace with it.

Where no namespace can be had (``unshare`` missing or refused), the agent runs as a
daemonised subreaper instead: orphans are still caught, and the host is not an ancestor of any
command, but commands can see other processes. ``SandboxInfo.pid_namespace`` says which.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import sys
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from ..seam.capabilities import (
    Branching,
    DurableSessions,
    ResourceUsage,
    SandboxKill,
    SandboxUsage,
)
from ..seam.errors import ConfigurationError, CouldNotRunError
from ..seam.handle import SessionHandle
from ..seam.lifetime import EPHEMERAL, BackendLifetime, Durable, Ephemeral
from ..seam.models import SandboxInfo, SyncReport
from ..seam.protocol import WorkspaceTransfer
from .agentlink.channel import AgentChannel
from .agentlink.durable import DurableChannel, DurableMethods, the_durable
from .agentlink.launch import agent_command, stage_agent
from .agentlink.parts import AgentExec, LocalFiles
from .composed import AlwaysThere, ComposedBackend
from .host_durable import DurableHostAgent
from .host_overlay import HostOverlay, overlays_possible
from .host_usage import kill_tree, tree_usage
from .snapshots import LocalSnapshots
from .snapshots.fork_base import FORK_BASES, ForkBase
from .snapshots.local import SpareWorkspaces, branches_root

_log = logging.getLogger("toolseam")
_START_TIMEOUT_S = 10.0

# The agent each lifetime runs (``seam/lifetime.py``), chosen once when the backend is built:
# a third lifetime is one module beside host_durable.py and one row here.
AGENTS: dict[type, Callable[[str, Any], LocalAgent | DurableHostAgent]] = {
    Ephemeral: lambda python, lifetime: LocalAgent(python),
    Durable: lambda python, lifetime: DurableHostAgent(python, lifetime),
}


class HostBackend(LocalSnapshots, DurableMethods, ComposedBackend):
    """Runs on this machine. ``pid_namespace``: True requires one, False never tries,
    None (default) uses one when the system allows it. ``network``: ``"host"`` (default)
    leaves commands this machine's network; ``"egress"`` gives them a network namespace of
    their own with loopback alone, and the session's proxy as the only way out (it requires the
    namespaces: refused at open where the host cannot make them). ``lifetime``: ``Ephemeral``
    (default) or ``Durable`` — a session that outlives its client (``seam/lifetime.py``)."""

    name = "host"
    capabilities: ClassVar[frozenset[type]] = ComposedBackend.capabilities | {
        DurableSessions, Branching, SandboxKill, ResourceUsage, WorkspaceTransfer}

    def __init__(self, workspace: str | None = None, *, pid_namespace: bool | None = None,
                 python: str | None = None, network: str = "host",
                 lifetime: BackendLifetime = EPHEMERAL) -> None:
        super().__init__(LocalFiles(self._opened_agent), AgentExec(self._agent))
        self.workspace = os.path.abspath(workspace or os.getcwd())
        self._spares = SpareWorkspaces()  # its closed branches' workspaces (decision 514)
        self._recycle_to: SpareWorkspaces | None = None  # a fork's child: its parent's
        self.fork_base: ForkBase | None = None  # as root: its last fork's base (decision 516)
        self._overlay: HostOverlay | None = None  # as root, a fork's child: its workspace
        if network not in ("host", "egress"):
            raise ConfigurationError(f"host backend: network {network!r} is not 'host' or "
                                     "'egress' (the host has no engine to give 'none' or 'bridge')")
        if network == "egress" and pid_namespace is False:
            raise ConfigurationError("host backend: network 'egress' needs the agent's "
                                     "namespaces; pid_namespace=False cannot have it")
        self.network = network
        self._want_namespace = True if network == "egress" else pid_namespace
        if type(lifetime) not in AGENTS:
            raise ConfigurationError("host backend: lifetime must be toolseam.seam.lifetime's "
                                     f"Ephemeral() or Durable(...), got {type(lifetime).__name__}")
        self._lifetime = lifetime
        self.agent = AGENTS[type(lifetime)](python or sys.executable, lifetime)
        self._opening: asyncio.Lock | None = None
        self.liveness = _HostLiveness(self)


    async def _opened_agent(self) -> AgentChannel:
        await self.open()
        return self._agent()

    def _agent(self) -> AgentChannel:
        if self.agent.channel is None:
            raise CouldNotRunError("the host agent is not running", retryable=True,
                                   cause="sandbox_lost")
        return self.agent.channel

    async def resource_usage(self) -> SandboxUsage:
        """``seam.capabilities.ResourceUsage``: the agent's process tree (``host_usage.py``)."""
        if self._info is None or self._closed:
            return SandboxUsage()
        return tree_usage(self.agent.launcher_pid)

    def kill_sandbox(self) -> None:
        """``seam.capabilities.SandboxKill``: SIGKILL to the agent's whole process tree."""
        if self._info is not None and not self._closed:
            kill_tree(self.agent.launcher_pid)

    async def open(self) -> SandboxInfo:
        self._check_open()
        if self._info is not None:
            return self._info
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._info is None:
                self._info = await self._start_agent()
        return self._info

    async def _start_agent(self) -> SandboxInfo:
        attempts = [True, False] if self._want_namespace is None else [self._want_namespace]
        if attempts[0] and shutil.which("unshare") is None:
            attempts = [False] if self._want_namespace is None else attempts
        failure = ""
        for namespace in attempts:
            try:
                hello = await self.agent.start(namespace, own_network=self.network == "egress")
            except CouldNotRunError as exc:
                failure = exc.reason
                await self.agent.stop()
                continue
            if self.network == "egress" and not (hello.get("proc_locked")
                                                 and hello.get("run_hidden")):
                await self.agent.stop()
                detail = " | ".join(self.agent.stderr_tail)
                raise CouldNotRunError(
                    "network 'egress': the host agent could not lock its namespace or hide "
                    f"/run from commands ({detail}); refusing to run them unconfined",
                    retryable=False, cause="refused")
            if namespace and hello.get("proc_locked") is False:
                _log.warning("host agent: no user namespace could be had, so a command running "
                             "as root can unmount /proc and see this process: %s",
                             " | ".join(self.agent.stderr_tail))
            return SandboxInfo(backend=self.name, workspace=self.workspace, local=True,
                               pid_namespace=bool(hello.get("pid_namespace")),
                               agent_pid=int(hello["pid"]))
        if self.network == "egress":
            failure += ("; network 'egress' needs a user, pid and network namespace for the "
                        "agent (unshare), which this host does not allow")
        raise CouldNotRunError(f"cannot start the host agent: {failure}", retryable=False,
                               cause="agent_failed")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.agent.stop()
        finally:
            if self._overlay is not None:  # its agent is gone: nothing uses the mount
                await asyncio.to_thread(self._overlay.unmount)
            if self._recycle_to is not None:  # a fork's child: its files for the next fork
                kept = self._known_tree
                known = kept[1] if kept is not None and kept[0] == self.workspace else None
                await asyncio.to_thread(self._recycle_to.put, self.workspace, known)
            await asyncio.to_thread(self._spares.close)
            if self.fork_base is not None:
                await asyncio.to_thread(FORK_BASES.let_go, self)

    # --- sessions that outlive their client (seam/capabilities.py: DurableSessions) -------
    @property
    def lifetime(self) -> BackendLifetime:
        return self._lifetime

    @classmethod
    def from_handle(cls, handle: SessionHandle, options: dict[str, Any]) -> HostBackend:
        if handle.network == "egress":
            options = {**options, "network": "egress"}
        return cls(handle.workspace, lifetime=Durable.attaching(handle), **options)

    def durable_channel(self) -> DurableChannel:
        return the_durable(self.agent.channel)

    def durable_handle(self, session_id: str, secret: str) -> SessionHandle:
        return SessionHandle(backend="host", socket=self._durable_agent().socket_path,
                             sandbox=str(self._info.agent_pid if self._info else ""),
                             workspace_mode="host", workspace=self.workspace,
                             session_id=session_id, secret=secret,
                             network=self.network)

    async def detach(self) -> None:
        await self._durable_agent().detach()
        self._closed = True

    def _durable_agent(self) -> DurableHostAgent:
        if not isinstance(self.agent, DurableHostAgent):
            raise ConfigurationError("this host backend was built to end with its client "
                                     "(lifetime=Ephemeral): it has no handle and cannot detach")
        return self.agent

    # --- branches (seam/capabilities.py: Branching; snapshots: backends/snapshots/local.py) --
    def branch_backend(self, workspace: str, snapshot_id: str) -> tuple[HostBackend, str]:
        child = HostBackend(workspace, pid_namespace=self._want_namespace,
                            python=self.agent.python, network=self.network)
        # an open session keeps what its fork leaves for its next (its close removes it); a
        # template never opened (the remote server's) has no close to: it goes with the child
        opened = self._info is not None and not self._closed
        manifest = self.fork_manifest(snapshot_id)
        if overlays_possible(workspace, str(branches_root())):  # as root (decision 516)
            child._overlay = HostOverlay.mount(self if opened else None, manifest, workspace)
            child._known_tree = (workspace, child._overlay.known())
            return child, workspace
        known = self._spares.take_into(workspace)  # a closed branch's files (decision 514)
        if known is not None:
            child._known_tree = (workspace, known)
        # it remembers what it wrote: cost what changed
        child._restore(workspace, snapshot_id, manifest=manifest)
        child._recycle_to = self._spares if opened else None
        return child, workspace

    def branch_home(self, root: str) -> str:
        return root

    def home_stamps(self) -> None:
        return None  # the base dir is the session's files

    async def ready_branch_home(self) -> None:
        return None  # the base dir is the home, always up to date

    async def keep_directly(self, home: object) -> None:
        return None  # a branch's files are its private directory already

    # --- transfer: the workspace is the host dir itself ----------------------------------
    @property
    def copy_back_error(self) -> CouldNotRunError | None:
        return None  # nothing is ever copied back

    async def sync(self) -> SyncReport:
        return SyncReport()  # nothing to bring home: commands work in the host dir

    async def upload(self, local: str, dest: str) -> None:
        await asyncio.to_thread(_copy, local, self._inside(dest), "upload", "on this host",
                                "in the workspace")

    async def download(self, src: str, local: str) -> None:
        await asyncio.to_thread(_copy, self._inside(src), local, "download", "in the workspace",
                                "on this host")

    def _inside(self, path: str) -> str:
        full = os.path.normpath(os.path.join(self.workspace, path))
        if not full.startswith(self.workspace + os.sep):
            raise ConfigurationError(f"{path!r} is not below the workspace {self.workspace}")
        return full


def _copy(source: str, target: str, what: str, source_side: str, target_side: str) -> None:
    """A file or directory, symlinks as symlinks, to a target that does not exist yet; the
    errors say which side each path was looked for on (the same words as a container's)."""
    if not os.path.lexists(source):
        raise ConfigurationError(f"{what}: {source} does not exist {source_side}")
    if os.path.lexists(target):
        raise ConfigurationError(f"{what}: {target} already exists {target_side}")
    if os.path.isdir(source) and not os.path.islink(source):
        shutil.copytree(source, target, symlinks=True)
    else:
        shutil.copy2(source, target, follow_symlinks=False)


class _HostLiveness(AlwaysThere):
    """The host's sandbox is gone when its agent's channel is."""

    def __init__(self, backend: HostBackend) -> None:
        self._backend = backend

    def gone(self) -> bool:
        channel = self._backend.agent.channel
        return self._backend.info is not None and (channel is None or not channel.alive)


class LocalAgent:
    """The host backend's agent process and its channel."""

    def __init__(self, python: str) -> None:
        self.python = python
        self.channel: AgentChannel | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._stderr_tail: deque[str] = deque(maxlen=20)
        self._stderr_task: asyncio.Task[None] | None = None

    @property
    def stderr_tail(self) -> list[str]:
        """The agent's last lines on stderr."""
        return list(self._stderr_tail)

    @property
    def launcher_pid(self) -> int | None:
        """The process this machine started (``unshare``, or the agent before it daemonised)."""
        return None if self._process is None else self._process.pid

    async def start(self, namespace: bool, own_network: bool = False) -> dict[str, Any]:
        """Start the agent; returns its ``hello`` answer (raises CouldNotRunError). With
        ``own_network`` its namespace gets a network namespace of its own (egress mode)."""
        boot = [self.python, *agent_command(await asyncio.to_thread(stage_agent))]
        if namespace:
            # The agent then enters a user namespace of its own, so no command can unmount
            # this /proc and look at the host's (toolseam_agent/userns.py).
            user = [] if os.geteuid() == 0 else ["--user", "--map-current-user"]
            argv = ["unshare", *user, "--pid", "--fork", "--mount-proc", "--kill-child", *boot,
                    "--own-user-namespace", *(["--own-network"] if own_network else [])]
        else:
            argv = [*boot, "--daemonize"]
        # The agent is an ancestor of every command: it must carry no host secret.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        # One socketpair carries the protocol both ways (the agent's stdin and stdout): a
        # round trip over a socket is measurably cheaper than over two pipes.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *argv, stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=asyncio.subprocess.PIPE,
                env=env, close_fds=True)
        except OSError as exc:
            ours.close()
            raise CouldNotRunError(f"{argv[0]}: {exc.strerror}", retryable=False) from None
        finally:
            theirs.close()
        assert self._process.stderr
        self._stderr_task = asyncio.get_running_loop().create_task(
            self._collect_stderr(self._process.stderr))
        self.channel = await AgentChannel.over_socket(ours, "host agent")
        try:
            return await asyncio.wait_for(self.channel.hello(), _START_TIMEOUT_S)
        except (CouldNotRunError, TimeoutError) as exc:
            if isinstance(exc, CouldNotRunError) and self.channel.alive:
                raise  # it answered, in another protocol: its stderr says nothing more
            detail = " | ".join(self._stderr_tail) or str(exc)
            raise CouldNotRunError(detail, retryable=False) from None

    async def _collect_stderr(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self._stderr_tail.append(line.decode("utf-8", "replace").rstrip())

    async def stop(self) -> None:
        """Shut the agent down (it kills every job first) and reap its process."""
        channel, process, stderr_task = self.channel, self._process, self._stderr_task
        self.channel = self._process = self._stderr_task = None
        if channel is not None:
            await channel.shutdown()
        if process is not None:
            try:
                await asyncio.wait_for(process.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()  # --kill-child takes the namespace down with it
                await process.wait()
        if stderr_task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stderr_task, 5)
