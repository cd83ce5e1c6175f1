"""Copy mode (an engine that shares no filesystem with the host — another machine): nothing of
the host's is mounted. The bundle goes once into a volume per engine and bundle, the base dir
is copied in through the engine's archive API before the start and copied back on ``sync`` and
at close (``workspace_sync/``), and the channel is the engine's attach stream to the agent's
stdin/stdout (``attach``), which can drop without the sandbox dying.

A session that outlives its client (``sandbox.lifetime``, ``lifetimes/durable.py``): the agent
listens on an abstract unix socket inside the container (``@toolseam-agent-SESSION``: no file a
command could remove), and each connection is an engine ``exec`` of the relay
(``engine/exec_stream.py``, ``toolseam_agent/relay.py``) — the attach stream to the agent's
stdin is not used, so a closed connection ends one relay, never the agent (podman closes a
container's stdin whenever an attach ends). What the copy-back needs — the baseline of what
was copied in — is kept with the agent (``workspace_sync/kept.py``: after the copy-in, each sync
and each upload), so whichever process closes the session last brings the work home through
``finish`` as always. The container is not removed when it stops, for that copy-back: after an
orphan timeout the janitor of the next session on that engine removes it and its volume.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import tarfile
import tempfile
import time
from collections import deque
from typing import IO, Any, Literal

from toolseam_agent.attach_auth import KEY_VAR
from toolseam_agent.resolver import RESOLV_CONF

from ....seam.errors import CouldNotRunError
from ....seam.handle import AttachError, SessionHandle
from ....seam.models import SyncReport
from ...agentlink.durable import DurableChannel
from ..bundle.staged import bundle_command
from ..bundle.volume import agent_volume_for
from ..engine.attach import attach_channel
from ..engine.exec_stream import exec_channel
from ..engine.protocol import in_engine_thread
from ..engine.retry import transient_retry
from ..fork_overlay import ChildOverlay
from ..janitor import recover_command
from ..labels import (
    AGENT_MOUNT,
    CLOSING_LABEL,
    KEPT_CONTAINER_LABEL,
    KEPT_LABEL,
    KEPT_RETENTION_S,
    KEPT_VOLUME_LABEL,
    KEPT_WORKSPACE_LABEL,
    OWNER_LABEL,
    SESSION_LABEL,
    WORKSPACE,
    owner_label,
)
from ..options import SetidFiles
from ..sandbox import REMOVED, ContainerSandbox, adopt_running
from ..workspace_sync.kept import copy_state, restore_copy
from ..workspace_sync.tar_sync import WorkspaceCopy

ADDRESS_PREFIX = "@toolseam-agent-"
_LISTEN_TIMEOUT_S = 15.0


class CopyLiveness:
    """Copy mode's sandbox is gone only when the engine says its container stopped: a dropped
    attach stream is reconnected before the next call."""

    def __init__(self, mode: CopyMode, sandbox: ContainerSandbox) -> None:
        self._mode, self._sandbox = mode, sandbox

    def check(self) -> None:
        """The sandbox has its own copy; the base dir is only written at sync."""

    async def reconnect(self) -> CouldNotRunError | None:
        channel = self._sandbox.channel
        if self._sandbox.started and (channel is None or not channel.alive):
            await self._mode.reattach(self._sandbox)
            if self._mode.exited:
                return await self._sandbox.explain(None)
        return None

    async def explain(self, failure: CouldNotRunError) -> CouldNotRunError:
        channel = self._sandbox.channel
        if channel is not None and not channel.alive:
            return await self._mode.after_drop(self._sandbox, failure)
        return failure

    def gone(self) -> bool:
        return self._mode.exited  # a dropped attach stream is not a dead sandbox


class CopyMode:
    name: Literal["copy"] = "copy"
    shares_host_dir = False  # the sandbox works on a copy, brought home at sync and close

    def __init__(self, copy_limit: int, keep_group_write: bool,
                 setid_files: SetidFiles = None, overlay: ChildOverlay | None = None) -> None:
        # The copy-back's mode mask is the boundary (no set-id bit ever comes home), so
        # commands may make set-id files in their own container by default — a step that
        # builds or installs them works; "refuse" puts the set-id guard back (decision 146).
        self.guard = "try" if setid_files == "refuse" else "off"
        self._copy_limit = copy_limit
        self._keep_group_write = keep_group_write  # group/other write bits come home
        self.copy: WorkspaceCopy | None = None  # what the sandbox was given
        self.workspace_volume: str | None = None
        self.exited = False  # the engine reported the container stopped
        self.last_sync: SyncReport | None = None
        self.copy_back_error: CouldNotRunError | None = None  # close never raises: kept
        self.agent_stderr: deque[str] | None = None  # the engine keeps no log of it
        self.address = ""  # a listening agent's abstract socket (a session that outlives its client)
        self._copy_changed = True  # the baseline moved since the agent was given it
        # A fork's child on an engine of this machine (decision 507): its volume is an overlay
        # over the fork's base, so nothing is copied in. Its private host directory starts
        # empty with an empty baseline (its first sync brings the whole workspace there;
        # keep() goes straight home: ContainerBranching.keep_directly), and its close brings
        # nothing home: that directory goes with the child, and
        # an engine unmounts the overlay once the container stopped (podman's archive API then
        # reads an empty directory).
        self.overlay = overlay

    def liveness(self, sandbox: ContainerSandbox) -> CopyLiveness:
        return CopyLiveness(self, sandbox)

    # --- start ------------------------------------------------------------------------------
    async def start(self, sandbox: ContainerSandbox, bundle: str, labels: dict[str, str]
                    ) -> dict[str, Any]:
        if sandbox.lifetime.adopt is not None:
            return await self._attach_existing(sandbox, sandbox.lifetime.adopt)
        hello = await self._start(sandbox, bundle, labels)
        await self.keep_state(sandbox)
        return hello

    async def _start(self, sandbox: ContainerSandbox, bundle: str, labels: dict[str, str]
                     ) -> dict[str, Any]:
        engine = sandbox.engine
        lifetime = sandbox.lifetime
        command = bundle_command(AGENT_MOUNT)
        if lifetime.outlives_client:  # clients come and go: the agent listens for each
            self.address = f"{ADDRESS_PREFIX}{sandbox.session_id}"
            command = [*command, *lifetime.agent_args(self.address)]
        agent_volume = await in_engine_thread(lambda: agent_volume_for(
            engine, bundle, sandbox.image, sandbox.hardening, sandbox.session_id))
        volume = self.workspace_volume = f"toolseam-ws-{sandbox.session_id}"
        await in_engine_thread(lambda: self._create_workspace_volume(sandbox, volume, labels))
        spec = sandbox.spec(command, labels, binds=[], stdin_open=not lifetime.outlives_client,
                            volumes=[(agent_volume, AGENT_MOUNT, True), (volume, WORKSPACE, False)])
        if self.overlay is not None and self.overlay.image is not None:
            # the fork's start image holds the parent's layer (fork_image.py, decision 512)
            image = self.overlay.image
            spec = dataclasses.replace(spec, image=await in_engine_thread(image.wait))
        # a pool's sandbox starts with an empty workspace; its copy arrives at hand-out (adopt)
        egress = sandbox.hardening.limits.network == "egress"

        def before_start() -> None:
            if egress:
                _point_resolv_conf(sandbox)
            if not sandbox.awaiting_workspace:
                self._fill(sandbox)

        # kept when it stops: the close copies back from the stopped container
        await sandbox.launch(lifetime.finish_spec(spec, removed_when_stopped=False),
                             before_start=before_start)
        try:
            await self._attach(sandbox)
        except CouldNotRunError as exc:
            state = await sandbox.state()
            if state is not None and not state.running:
                raise await sandbox.explain(None, starting=True) from None
            raise exc from None
        assert sandbox.channel is not None
        return await sandbox.channel.hello()

    def _create_workspace_volume(self, sandbox: ContainerSandbox, volume: str,
                                 labels: dict[str, str]) -> None:
        """The volume the sandbox's ``/workspace`` is: empty, or a fork child's overlay."""
        if self.overlay is not None:
            self.overlay.create_volume(sandbox.engine, volume, labels)
        else:
            sandbox.engine.create_volume(volume, labels)

    def _fill(self, sandbox: ContainerSandbox) -> None:
        """Before the start: the workspace volume given the base dir's files (an overlay
        has them already)."""
        if self.overlay is not None:
            self.overlay.wait()  # the base restored (made while the container was)
            self.copy = WorkspaceCopy(sandbox.workspace, self._copy_limit,
                                      keep_group_write=self._keep_group_write)
            self._copy_changed = True
            return
        self._copy_in(sandbox, sandbox.workspace)

    def _copy_in(self, sandbox: ContainerSandbox, workspace: str) -> None:
        """The base dir, packed, into the container's workspace volume (stopped or running)."""
        assert sandbox.container is not None
        copy = WorkspaceCopy(workspace, self._copy_limit, keep_group_write=self._keep_group_write)
        with tempfile.TemporaryFile(prefix="toolseam-copy-in-") as archive:
            copy.pack(archive)
            # an empty base dir (an image-only workspace, a pool's claim without a base dir)
            # packs no entry: nothing to send, and the engine call it would cost is a pool
            # claim's whole time when many claims reach one engine at once (decision 311)
            if copy.baseline:
                archive.seek(0)
                sandbox.engine.put_archive(sandbox.container, WORKSPACE, archive)
        self.copy = copy
        self._copy_changed = True

    async def adopt(self, sandbox: ContainerSandbox, workspace: str) -> None:
        """A pool's hand-out: the base dir is copied into the running sandbox's workspace."""
        await in_engine_thread(lambda: self._copy_in(sandbox, workspace))
        sandbox.workspace = workspace

    async def _attach(self, sandbox: ContainerSandbox) -> None:
        assert sandbox.container is not None
        if sandbox.lifetime.outlives_client:
            await self._relay(sandbox)
            return
        old = sandbox.channel
        sandbox.channel, self.agent_stderr = await attach_channel(
            sandbox.engine.address, sandbox.engine.attach_path(sandbox.container),
            f"{sandbox.engine_name} container {sandbox.container}")
        if old is not None:  # jobs that outlived a dropped stream keep their live output
            sandbox.channel.adopt_listeners(old)

    # --- a dropped attach stream --------------------------------------------------------------
    async def after_drop(self, sandbox: ContainerSandbox, failure: CouldNotRunError
                         ) -> CouldNotRunError:
        """The attach stream closed mid-call. The call's answer is lost either way; whether
        the session is depends on the container, as the engine reports it."""
        state = await sandbox.state()
        if state is not None and not state.running:
            self.exited = True
            return await sandbox.explain(failure)
        where = f"the {sandbox.engine_name} engine at {sandbox.engine.endpoint}"
        if state is None:
            return CouldNotRunError(f"lost the connection to {where} ({failure.reason}); the "
                                    "sandbox may still run: the next call reconnects",
                                    retryable=True, cause="engine_unreachable")
        return CouldNotRunError(f"the connection to the sandbox through {where} dropped during "
                                f"the call ({failure.reason}); the next call reconnects",
                                retryable=True, cause="engine_unreachable")

    async def reattach(self, sandbox: ContainerSandbox) -> None:
        """A new attach stream to the same agent (jobs kept running meanwhile)."""
        state = await sandbox.state()
        if state is None:
            raise CouldNotRunError(f"the {sandbox.engine_name} engine at "
                                   f"{sandbox.engine.endpoint} is unreachable; the sandbox may "
                                   "still run", retryable=True)
        if not state.running:
            self.exited = True
            return
        try:
            await self._attach(sandbox)
        except CouldNotRunError:
            # it stopped between the state read and the attach: the engine refuses an attach
            # to a stopped container ("container state improper", seen under a CPU hog)
            state = await sandbox.state()
            if state is not None and not state.running:
                self.exited = True
                return
            raise
        # podman ends the agent when an attach ends: it may have stopped between the state
        # read and the attach, and an attach to a stopped container is upgraded and then held
        # open, waiting for a start that never comes — a call on it would wait forever (seen
        # in a rehearsal: the dropped-connection test on podman over TCP, hung 37 min). Once
        # attached, a container that still runs ends the stream when it stops.
        state = await sandbox.state()
        if state is not None and not state.running:
            self.exited = True
            channel, sandbox.channel = sandbox.channel, None
            if channel is not None:
                await channel.close(drain_s=0.5)

    def exit_reason(self, exit_code: int | None) -> str | None:
        """A clean exit after the start: podman closes the agent's input whenever an attach
        ends, even on a dropped connection."""
        if exit_code != 0:
            return None
        return ("the sandbox ended when its attach stream closed: the engine closed the "
                "agent's input (podman does whenever an attach ends, even on a dropped "
                "connection); its changes come home at close")

    # --- uploads, sync, close ---------------------------------------------------------------
    def pack_upload(self, local: str, name: str, archive: IO[bytes]) -> None:
        assert self.copy is not None
        self.copy.pack_upload(local, name, archive)

    def uploaded(self, archive: str, parent: str) -> None:
        """An upload is the sandbox's own: it comes home only if the sandbox changes it."""
        assert self.copy is not None
        self.copy.remember_uploaded(archive, parent)
        self._copy_changed = True  # kept with the toolkit's state after the call

    async def sync(self, sandbox: ContainerSandbox) -> SyncReport:
        """Bring the sandbox's changes to the base dir home."""
        if self.copy is None or sandbox.container is None:
            return SyncReport()
        report = await asyncio.to_thread(self._copy_back_retried, sandbox)
        self._copy_changed = True
        await self.keep_state(sandbox)
        return report

    def _copy_back(self, sandbox: ContainerSandbox) -> SyncReport:
        assert self.copy is not None and sandbox.container is not None
        source = (f"the {sandbox.engine_name} container {sandbox.container[:12]} (volume "
                  f"{self.workspace_volume})")
        try:
            with sandbox.engine.get_archive(sandbox.container, WORKSPACE) as chunks:
                spool = self.copy.spool(chunks, "the sandbox's workspace")
            with spool:
                return self.copy.apply(spool, source=source)
        except (tarfile.TarError, EOFError) as exc:
            # an archive the engine cut short (a file changing while it is read); the copy
            # applies all or nothing, so asking again is safe
            raise CouldNotRunError(f"the {sandbox.engine_name} engine's archive of the "
                                   f"sandbox's workspace was unreadable ({type(exc).__name__}: "
                                   f"{exc}); nothing was copied back", retryable=True) from None

    def _copy_back_retried(self, sandbox: ContainerSandbox) -> SyncReport:
        """A copy-back, asked again (bounded) while it fails in a way that may pass: an archive
        read while a build writes can come back cut short."""
        return transient_retry(lambda: self._copy_back(sandbox),
                               lambda e: isinstance(e, CouldNotRunError) and e.retryable)

    async def closing(self, sandbox: ContainerSandbox) -> None:
        """An owned container is this process's: no janitor takes it while it copies back.
        One without an owner (any client may attach) is marked closing by this process before
        its agent stops it: a janitor of another session on this engine would take a stopped
        one for a session that ended by itself — and remove it under this copy-back (seen in
        the suite, two workers on one engine)."""
        if not sandbox.lifetime.outlives_client:
            return
        labels = {CLOSING_LABEL: "1", OWNER_LABEL: owner_label(),
                  SESSION_LABEL: sandbox.session_id}
        with contextlib.suppress(CouldNotRunError):  # without it the copy-back goes on
            await asyncio.to_thread(sandbox.engine.create_volume, _closing_marker(sandbox),
                                    labels)

    async def finish(self, sandbox: ContainerSandbox) -> None:
        """After the agent ended every job: the changes come home (the archive API reads a
        stopped container as well). If they cannot, the container and its volume are kept and
        ``copy_back_error`` names them. A fork's overlay child brings nothing home."""
        if self.copy is None or sandbox.container is None or self.overlay is not None:
            return
        try:
            await _wait_stopped(sandbox)
            self.last_sync = await asyncio.to_thread(self._copy_back_retried, sandbox)
        except Exception as exc:  # noqa: BLE001 - any failure keeps the work, and says so
            reason = exc.reason if isinstance(exc, CouldNotRunError) else \
                f"{type(exc).__name__}: {exc}"
            self.copy_back_error = CouldNotRunError(
                f"the sandbox's changes were not copied back to {sandbox.workspace}: "
                f"{reason}. {await self._keep(sandbox)}", retryable=False,
                cause="copy_back_failed")
            sandbox.container = self.workspace_volume = self.copy = None

    async def clean_up(self, sandbox: ContainerSandbox) -> None:
        volume, self.workspace_volume = self.workspace_volume, None
        if volume is not None:
            with contextlib.suppress(CouldNotRunError):
                await asyncio.to_thread(sandbox.engine.remove_volume, volume)
        if sandbox.lifetime.outlives_client:
            with contextlib.suppress(CouldNotRunError):
                await asyncio.to_thread(sandbox.engine.remove_volume, _closing_marker(sandbox))
        if self.overlay is not None:  # its dirs, its hold on the base (after the mount went)
            await asyncio.shield(in_engine_thread(self.overlay.release))

    # --- a session that outlives its client (sandbox.lifetime) ----------------------------
    async def _relay(self, sandbox: ContainerSandbox) -> None:
        """Each connection: an exec of the relay into the agent's socket."""
        assert sandbox.container is not None
        container, address = sandbox.container, sandbox.engine.address
        attach_path = sandbox.engine.attach_path(container)
        relay = [*bundle_command(AGENT_MOUNT), "--relay", self.address]

        async def connect(channel: DurableChannel) -> None:
            # an exec inherits the container's environment: the agent's key is blanked, so
            # the relay's memory never holds it
            await exec_channel(address, attach_path, container, relay, channel,
                               env={KEY_VAR: ""})

        old = sandbox.channel
        label = f"{sandbox.engine_name} container {container}"
        deadline = time.monotonic() + _LISTEN_TIMEOUT_S
        while True:  # at the start, the relay may come before the agent listens
            try:
                sandbox.channel = await sandbox.lifetime.open_channel(self.address, label,
                                                                      connect)
                break
            except CouldNotRunError:
                state = await sandbox.state()
                if time.monotonic() > deadline or state is None or not state.running:
                    raise
                await asyncio.sleep(0.05)
        if old is not None:
            sandbox.channel.adopt_listeners(old)

    async def _attach_existing(self, sandbox: ContainerSandbox, handle: SessionHandle
                               ) -> dict[str, Any]:
        session = handle.socket.removeprefix(ADDRESS_PREFIX)
        self.address = handle.socket
        try:
            await adopt_running(sandbox, handle.sandbox)
            await self._relay(sandbox)
            assert sandbox.channel is not None
            saved = sandbox.lifetime.kept(sandbox.channel, "copy")
            if not isinstance(saved, dict):
                raise AttachError("protocol", "the session kept no copy-back baseline")
            self.copy = restore_copy(saved, handle.workspace)
            self._copy_changed = False
            self.workspace_volume = f"toolseam-ws-{session}"
            sandbox.session_id = session
            return await sandbox.channel.hello()
        except BaseException:
            channel, sandbox.channel = sandbox.channel, None  # nothing here is ours to end
            await sandbox.lifetime.let_go(channel)
            sandbox.container = None
            self.copy = self.workspace_volume = None
            raise

    async def detach(self, sandbox: ContainerSandbox) -> None:
        """Leave the container and its jobs running; the next client finishes and cleans up."""
        await self.keep_state(sandbox)
        channel, sandbox.channel = sandbox.channel, None
        await sandbox.lifetime.let_go(channel)
        sandbox.container = None
        self.copy = self.workspace_volume = None
        await asyncio.to_thread(sandbox.engine.close)

    async def keep_state(self, sandbox: ContainerSandbox) -> None:
        """Give a listening agent the copy-back baseline when it changed."""
        if self.copy is None or not self._copy_changed or not sandbox.lifetime.outlives_client:
            return
        try:
            kept = await sandbox.lifetime.keep(sandbox.channel, "copy", copy_state(self.copy))
        except CouldNotRunError:
            return
        self._copy_changed = not kept

    async def _keep(self, sandbox: ContainerSandbox) -> str:
        """Mark the container and its workspace volume kept; the sentence that says how to
        get the work out."""
        container, volume = sandbox.container or "", self.workspace_volume or ""
        labels = {KEPT_LABEL: str(int(time.time())), KEPT_CONTAINER_LABEL: container,
                  KEPT_VOLUME_LABEL: volume, KEPT_WORKSPACE_LABEL: sandbox.workspace,
                  SESSION_LABEL: sandbox.session_id}
        try:
            await asyncio.to_thread(sandbox.engine.create_volume,
                                    f"toolseam-kept-{sandbox.session_id}", labels)
            kept = f"kept for {KEPT_RETENTION_S // 86400} days"
        except CouldNotRunError as exc:
            kept = (f"not removed, but could not be marked kept ({exc.reason}): the next "
                    "session's janitor may remove them, recover now")
        state = await sandbox.state()
        if state is not None and state.status == REMOVED:  # removed from outside: no recover
            return (f"The container {container[:12]} was removed from the engine under the "
                    f"session; its workspace volume {volume} is {kept} (the files are in it)")
        command = recover_command(sandbox.engine_name, sandbox.engine.endpoint, container)
        return (f"The container {container[:12]} and its workspace volume are {kept}. Recover "
                f"the work with: {command} --to DIR   (then: {command} --remove)")


async def _wait_stopped(sandbox: ContainerSandbox, timeout_s: float = 10.0) -> None:
    """After the agent's shutdown: the archive of a container that is still stopping can fail
    (podman joins the mount namespace of a process that is exiting)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = await sandbox.state()
        if state is None or not state.running:
            return
        await asyncio.sleep(0.05)


def _closing_marker(sandbox: ContainerSandbox) -> str:
    return f"toolseam-closing-{sandbox.session_id}"


def _point_resolv_conf(sandbox: ContainerSandbox) -> None:
    """Egress: the created container's ``/etc/resolv.conf`` names the agent's resolver, written
    through the archive API before the start (a read-only root is read-only from then on).
    Engines do not agree on ``--dns`` without a network: a podman 4 leaves the image's file,
    whatever it is told. An engine that refuses (docker on a read-only root, which honours
    ``--dns``) leaves it to the agent (``toolseam_agent/resolver.point_resolv_conf``)."""
    assert sandbox.container is not None
    data = RESOLV_CONF.encode()
    with tempfile.TemporaryFile(prefix="toolseam-resolv-") as archive:
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo("resolv.conf")
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        archive.seek(0)
        with contextlib.suppress(CouldNotRunError):
            sandbox.engine.put_archive(sandbox.container, "/etc", archive)
