"""The seam, forwarded to a file part and an exec part (``agentlink/parts.py``): what every
backend is. A subclass brings its sandbox up and down, and says how to tell it is gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import ClassVar, ParamSpec, Protocol, TypeVar

from toolseam_agent.wire import EGRESS_LISTEN, HELLO

from ..seam.capabilities import Egress, ExposedPorts, InteractiveProcesses
from ..seam.errors import CouldNotRunError, SessionClosedError
from ..seam.models import (
    ByteContent,
    ChangeSet,
    CommitResult,
    DirListing,
    FileListing,
    FileStat,
    GlobMatch,
    GrepListing,
    JobStatus,
    PageRequest,
    PathRef,
    SandboxInfo,
    SpawnRequest,
    TextContent,
    TextPage,
    WriteResult,
)
from ..seam.protocol import OutputCallback
from .agentlink.channel import AgentChannel
from .agentlink.fd_lane import FdLane, ServeOpened
from .agentlink.interactive import AgentInteractive
from .agentlink.parts import AgentExec, FileMethods
from .agentlink.ports import ForwardedPort, PortMux
from .agentlink.tunnel import PortsFor, TunnelMux

T = TypeVar("T")
P = ParamSpec("P")


class Liveness(Protocol):
    """Whether a backend's sandbox is still there, asked around every call — one object per
    kind of sandbox (the host's agent, a bind-mode or a copy-mode container)."""

    def check(self) -> None:
        """A cheap check before each call; raises CouldNotRunError when the session is over."""

    async def reconnect(self) -> CouldNotRunError | None:
        """Before each call: a channel that can drop without its sandbox dying (an engine over
        the network) is got back here; a failure raises and the session lives. Returns why
        the session is over when the sandbox turned out gone."""

    async def explain(self, failure: CouldNotRunError) -> CouldNotRunError:
        """A call's could-not-run, replaced with what happened to the sandbox if it is known."""

    def gone(self) -> bool:
        """Whether the sandbox is gone for good (after a call failed)."""


class AlwaysThere:
    """A sandbox that outlives every call (a test's backend, or one that cannot tell)."""

    def check(self) -> None:
        return None

    async def reconnect(self) -> CouldNotRunError | None:
        return None

    async def explain(self, failure: CouldNotRunError) -> CouldNotRunError:
        return failure

    def gone(self) -> bool:
        return False


class ComposedBackend(AgentInteractive):
    """Forwards the seam to a file part and an exec part; subclasses bring them up and down,
    and set ``liveness``. Interactive processes come over the same channel
    (``agentlink/interactive.py``)."""

    name = "composed"
    # what every backend whose commands an agent runs has (seam/capabilities.py)
    capabilities: ClassVar[frozenset[type]] = frozenset({Egress, ExposedPorts,
                                                         InteractiveProcesses})
    network = "none"  # what commands can reach: "none", "bridge", "egress" (or "host")
    # captured connections: the agent points /etc/resolv.conf at its resolver itself (a
    # container's own file, which an engine may have written with its nameserver whatever
    # --dns says); never the host backend's, which its agent mounted in its own namespace
    agent_writes_resolv_conf = False

    def __init__(self, files: FileMethods, exec_part: AgentExec) -> None:
        self._files = files
        self._exec = exec_part
        self._info: SandboxInfo | None = None
        self._closed = False
        self._over: CouldNotRunError | None = None  # the sandbox died: every call says so
        self.liveness: Liveness = AlwaysThere()

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(f"the {self.name} backend was closed")

    async def open(self) -> SandboxInfo:
        raise NotImplementedError

    def _agent(self) -> AgentChannel:
        """The channel to the sandbox's agent now (a reconnect may replace it)."""
        raise NotImplementedError

    async def open_egress(self, serve: ServeOpened, ca_pem: str | None,
                          ports_for: PortsFor | None = None) -> dict[str, object]:
        """Egress mode: the agent listens on 127.0.0.1 inside, and each connection it accepts
        is served here by ``serve`` (the session's proxy). Refused unless the sandbox sees no
        network interface but loopback — never silently unenforced. With ``ports_for``, the
        agent also resolves every name to an address of its own and captures connections to
        it (``toolseam_agent/resolver.py``). Returns the agent's ``port``, the ``ca_file`` it
        wrote (``ca_pem`` after the image's own roots) and ``capture`` (None when capturing,
        else why not)."""
        await self.open()
        return await self._run(self._start_egress, serve, ca_pem, ports_for)

    async def _start_egress(self, serve: ServeOpened, ca_pem: str | None,
                            ports_for: PortsFor | None = None) -> dict[str, object]:
        channel = self._agent()
        seen = (await channel.call(HELLO)).get("interfaces")
        if seen != ["lo"]:
            raise CouldNotRunError(
                f"network 'egress': the {self.name} sandbox sees the network interfaces {seen}, "
                "not loopback alone, so commands could go around the proxy; refusing to start "
                "(docs/network.md)", retryable=False, cause="refused")
        channel.carry_tunnels(TunnelMux(serve, channel.send_frame, channel.send_data, ports_for))
        # Where the agent shares this kernel, connections come whole (agentlink/fd_lane.py);
        # the frames stay for the rest (an engine's attach stream, an agent without the lane).
        lane = FdLane(serve) if channel.passes_descriptors else None
        try:
            where = await channel.call(
                EGRESS_LISTEN, pass_fd=lane.agent_end.fileno() if lane and lane.agent_end else None,
                ca_pem=ca_pem, capture=ports_for is not None,
                resolv_conf=self.agent_writes_resolv_conf, fd_lane=lane is not None)
        except BaseException:
            if lane is not None:
                lane.stop()
            raise
        if lane is not None:
            if where.get("lane"):
                if channel.lane is not None:
                    channel.lane.stop()
                lane.start()
                channel.lane = lane
            else:
                lane.stop()
        return where

    async def expose_port(self, port: int, host: str, host_port: int) -> ForwardedPort:
        """``seam.capabilities.ExposedPorts``: a listener here, carried over the channel
        (``agentlink/ports.py``); it closes with the channel's client."""
        await self.open()
        return await self._run(self._listen_for, port, host, host_port)

    async def _listen_for(self, port: int, host: str, host_port: int) -> ForwardedPort:
        channel = self._agent()
        ports = channel.ports or channel.carry_ports(PortMux(channel.send_frame))
        return await ForwardedPort.listen(ports, port, host, host_port)

    async def close(self) -> None:
        raise NotImplementedError

    @property
    def info(self) -> SandboxInfo | None:
        return self._info

    def _session_over(self, why: CouldNotRunError) -> CouldNotRunError:
        """The sandbox is gone for good (killed, OOM, its agent crashed): no call of this
        session can succeed again, so every one says so, not retryable — a host starts a new
        session (on the same workspace) rather than retrying into a dead one."""
        if self._over is None:
            # a workspace replaced under a bind mount keeps its own cause; the rest is a
            # sandbox that died (an RL trainer drops such a rollout rather than score it)
            cause = why.cause if why.cause in ("workspace_changed", "refused") else "sandbox_lost"
            self._over = CouldNotRunError(
                f"{why.reason}; this session is over (its sandbox is gone): start a new one",
                retryable=False, cause=cause)
        return self._over

    def _job_answer(self, status: JobStatus) -> JobStatus:
        """A job the agent killed because a signal told it to stop (its container stopped or
        removed from outside) did not fail: its sandbox died. Podman sends the agent SIGTERM
        first, and the job's "exit -15" looked like an ordinary result."""
        if status.sandbox_stopping:
            raise self._session_over(CouldNotRunError(
                f"the {self.name} sandbox was stopped from outside while job {status.job} ran "
                "(its agent was told to stop and killed the job)", retryable=False,
                cause="sandbox_lost"))
        return status

    async def _run(self, call: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        self._check_open()
        if self._over is not None:
            raise self._over
        live = self.liveness
        try:
            live.check()
        except CouldNotRunError as why:
            raise self._session_over(why) from None
        over = await live.reconnect()
        if over is not None:
            raise self._session_over(over)
        try:
            return await call(*args, **kwargs)
        except CouldNotRunError as failure:
            explained = await live.explain(failure)
            if live.gone():
                raise self._session_over(explained) from None
            raise explained from None

    async def start(self, request: SpawnRequest, on_output: OutputCallback | None = None
                    ) -> JobStatus:
        if self._info is None:  # opened on first use; once open, straight on (every bash call)
            self._check_open()
            await self.open()
        return self._job_answer(await self._run(self._exec.start, request, on_output))

    async def wait(self, job: str, wait_ms: int | None) -> JobStatus:
        return self._job_answer(await self._run(self._exec.wait, job, wait_ms))

    async def kill(self, job: str) -> JobStatus:
        return self._job_answer(await self._run(self._exec.kill, job))

    async def release(self, job: str) -> None:
        if not self._closed:
            await self._run(self._exec.release, job)

    async def stat(self, ref: PathRef) -> FileStat:
        return await self._run(self._files.stat, ref)

    async def read_text(self, ref: PathRef, offset: int | None = None, limit: int | None = None,
                        refuse_above_bytes: int | None = None) -> TextContent:
        return await self._run(self._files.read_text, ref, offset, limit, refuse_above_bytes)

    async def read_bytes(self, ref: PathRef, refuse_above_bytes: int | None = None
                         ) -> ByteContent:
        return await self._run(self._files.read_bytes, ref, refuse_above_bytes)

    async def read_page(self, ref: PathRef, page: PageRequest) -> TextPage:
        return await self._run(self._files.read_page, ref, page)

    async def list_dir(self, ref: PathRef, cap: int) -> DirListing:
        return await self._run(self._files.list_dir, ref, cap)

    async def write(self, ref: PathRef, data: bytes, keep_bom: bool = False) -> WriteResult:
        return await self._run(self._files.write, ref, data, keep_bom)

    async def commit(self, change: ChangeSet) -> CommitResult:
        return await self._run(self._files.commit, change)

    async def list_files(self, ref: PathRef, match: GlobMatch | None = None) -> FileListing:
        return await self._run(self._files.list_files, ref, match)

    async def grep(self, ref: PathRef, pattern: str, include: GlobMatch | None = None,
                   deadline_ms: int | None = None) -> GrepListing:
        return await self._run(self._files.grep, ref, pattern, include, deadline_ms)
