"""Bind mode (a local engine): the workspace, the bundle and a socket directory are bind mounts,
and the agent listens on a unix socket the host connects to. Everything bind mode does that copy
mode does not is here; ``ContainerSandbox`` holds the lifecycle both share.

A session that outlives its client (``sandbox.lifetime``, ``lifetimes/durable.py``) changes
little here: the agent listens on the same socket as a durable agent, no command may make or
remove anything in the socket directory, the engine removes the container when its agent ends
itself, and an attach starts nothing — it checks the container with the engine and connects
to the socket the handle names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import tarfile
import tempfile
import time
from collections import deque
from typing import IO, Any, Literal

from toolseam_agent.landlock import DOMAIN_VAR
from toolseam_agent.resolver import RESOLV_CONF

from ....seam.errors import ConfigurationError, CouldNotRunError
from ....seam.handle import SessionHandle
from ....seam.models import SyncReport
from ...staging import user_dir
from ..bundle.staged import bundle_command
from ..engine.protocol import in_engine_thread
from ..host_dirs import check_workspace
from ..labels import AGENT_MOUNT, SOCKET_DIR_PREFIX, SOCKET_MOUNT, WORKSPACE
from ..options import SetidFiles
from ..pool.mounts import HOST_SLOTS, SlotMounts, release_slot
from ..sandbox import ContainerSandbox, adopt_running
from .workspace_access import check_workspace_access

_CONNECT_TIMEOUT_S = 15.0


class BindLiveness:
    """Bind mode's sandbox is gone when its channel is; the workspace a bind mount pins must
    still be the directory it started with."""

    def __init__(self, mode: BindMode, sandbox: ContainerSandbox) -> None:
        self._mode, self._sandbox = mode, sandbox

    def check(self) -> None:
        """If the host's workspace path now names another directory (renamed away, recreated),
        the sandbox would go on writing into the old one — fail closed instead."""
        started = self._mode.workspace_id
        if started is not None and identity(self._sandbox.workspace) != started:
            raise CouldNotRunError(f"the workspace {self._sandbox.workspace} was renamed, removed "
                                   "or replaced since the sandbox started", retryable=False,
                                   cause="workspace_changed")

    async def reconnect(self) -> CouldNotRunError | None:
        return None  # a unix socket on this machine does not drop while the agent lives

    async def explain(self, failure: CouldNotRunError) -> CouldNotRunError:
        channel = self._sandbox.channel
        if channel is not None and not channel.alive:
            return await self._sandbox.explain(failure)
        return failure

    def gone(self) -> bool:
        channel = self._sandbox.channel
        return self._sandbox.started and (channel is None or not channel.alive)


logger = logging.getLogger(__name__)


class BindMode:
    name: Literal["bind"] = "bind"
    shares_host_dir = True  # the sandbox works in the host's directory itself

    def __init__(self, setid_files: SetidFiles = None, slots: SlotMounts = HOST_SLOTS) -> None:
        # No command may start without the set-id guard: the container writes the host dir
        # itself, as host root on a rootful engine (docs/security.md). A rootless engine's root
        # is an unprivileged user: ``setid_files="allow"`` lets its commands make set-id files,
        # which reach the host dir as that user's (decision 146).
        self._setid_files = setid_files
        self.guard = "require"
        self.workspace_id: tuple[int, int] | None = None
        self._socket_dir: str | None = None
        self.last_sync: SyncReport | None = None  # nothing is ever copied back
        self.copy_back_error: CouldNotRunError | None = None
        self.agent_stderr: deque[str] | None = None  # the engine keeps the agent's log
        self._host_root = False  # commands act as host root on the workspace
        self._slot: str | None = None  # a pool's slot the workspace is mounted onto
        self.slots = slots  # where a pool's slot mounts are made (pool/warm.py)

    @property
    def address(self) -> str:
        """The agent's socket on this machine ("" before the start)."""
        return os.path.join(self._socket_dir, "agent.sock") if self._socket_dir else ""

    @property
    def slot(self) -> str | None:
        """The pool's slot the workspace was mounted onto at hand-out, if any."""
        return self._slot

    def liveness(self, sandbox: ContainerSandbox) -> BindLiveness:
        return BindLiveness(self, sandbox)

    async def start(self, sandbox: ContainerSandbox, bundle: str, labels: dict[str, str]
                    ) -> dict[str, Any]:
        if sandbox.lifetime.adopt is not None:
            return await self._attach(sandbox, sandbox.lifetime.adopt)
        # one verdict, before any engine says it its own way
        check_workspace(sandbox.workspace)
        self.workspace_id = identity(sandbox.workspace)
        if self.workspace_id is None:  # removed since the check
            check_workspace(sandbox.workspace)
        owner = socket_owner(sandbox.engine.endpoint)
        if not sandbox.awaiting_workspace:  # a pool's empty slot is the pool's own
            await in_engine_thread(lambda: check_workspace_access(
                sandbox.workspace, owner, sandbox.engine_name))
        if self._setid_files == "allow":
            if owner in (None, 0):
                raise ConfigurationError(
                    f"setid_files='allow': the {sandbox.engine_name} engine runs containers as "
                    "host root, so a set-id file in the bind-mounted workspace would be a "
                    "set-id-root program on the host; use rootless podman or "
                    "workspace_mode='copy' (the copy-back strips set-id bits)")
            self.guard = "off"
        self._socket_dir = tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX, dir=user_dir("sockets"))
        if os.geteuid() == 0 and owner not in (None, 0):
            os.chown(self._socket_dir, owner, owner)
        os.chmod(self._socket_dir, 0o700)
        lifetime = sandbox.lifetime
        command = [*bundle_command(AGENT_MOUNT),
                   *lifetime.agent_args(f"{SOCKET_MOUNT}/agent.sock")]
        # a pool's sandbox binds its slot, onto which the base dir is mounted at hand-out
        binds = [(sandbox.workspace, WORKSPACE, False), (bundle, AGENT_MOUNT, True),
                 (self._socket_dir, SOCKET_MOUNT, False)]
        if sandbox.hardening.limits.network == "egress":
            # captured connections: names go to the agent's resolver (toolseam_agent/resolver.py)
            conf = os.path.join(self._socket_dir, "resolv.conf")
            with open(conf, "w", encoding="ascii") as text:
                text.write(RESOLV_CONF)
            os.chmod(conf, 0o644)
            binds.append((conf, "/etc/resolv.conf", True))
        spec = sandbox.spec(command, labels, binds=binds,
            slave_binds=(WORKSPACE,) if sandbox.awaiting_workspace else ())
        if lifetime.outlives_client:
            # The socket directory is a bind mount later clients connect through: no command
            # may make, remove or rename anything in it (toolseam_agent/landlock.py)
            spec = dataclasses.replace(spec, environment={
                **spec.environment, DOMAIN_VAR: f"scope:{SOCKET_MOUNT}"})
        # nothing to bring home from a stopped container: the engine may remove it at once
        await sandbox.launch(lifetime.finish_spec(spec, removed_when_stopped=True))
        hello = await self._connect(sandbox)
        # an agent that reports its set-id guard (toolseam_agent/server.py's hello) says so at
        # open; one that does not refuses each command instead (setid_guard "require")
        guard = str(hello.get("setid_guard", ""))
        if guard.startswith("unavailable"):
            raise CouldNotRunError(
                f"the sandbox's set-id guard is {guard}: in bind mode a command could "
                f"leave a set-id program in {sandbox.workspace} (docs/security.md); refusing "
                "to start (copy mode does without it)", retryable=False)
        self._host_root = owner == 0 and hello.get("uid") == 0
        if not sandbox.awaiting_workspace:
            self._warn_host_root(sandbox)
        return hello

    def _warn_host_root(self, sandbox: ContainerSandbox) -> None:
        if self._host_root:
            # Never silently host root: neither engine maps container root to another uid here
            # (docs/decisions.md 45), so say so at every such open.
            logger.warning(
                "%s container %s: commands run as host root on %s (a rootful engine in bind "
                "mode: the set-id guard refuses set-id files, but what they make is root's); "
                "rootless podman or workspace_mode='copy' avoid it (docs/security.md)",
                sandbox.engine_name, sandbox.container, sandbox.workspace)

    async def adopt(self, sandbox: ContainerSandbox, workspace: str) -> None:
        """A pool's hand-out: the base dir is bind-mounted onto the slot the running container
        has at ``/workspace`` (slave propagation: it appears there at once). The pool checks
        that the container sees it (``pool.py``)."""
        check_workspace(workspace)
        # mounted by root onto the slot: only the workspace itself must suit the engine's user
        owner = socket_owner(sandbox.engine.endpoint)
        await in_engine_thread(lambda: check_workspace_access(
            workspace, owner, sandbox.engine_name, through_parents=False))
        slot = sandbox.workspace
        slots = self.slots
        await in_engine_thread(lambda: slots.bind(workspace, slot))
        self._slot = slot
        sandbox.workspace = workspace
        self.workspace_id = identity(workspace)
        self._warn_host_root(sandbox)

    async def _connect(self, sandbox: ContainerSandbox) -> dict[str, Any]:
        assert self._socket_dir is not None
        path = os.path.join(self._socket_dir, "agent.sock")
        deadline = time.monotonic() + _CONNECT_TIMEOUT_S
        delay = 0.002
        while True:
            if os.path.exists(path):
                try:
                    sandbox.channel = await sandbox.lifetime.open_channel(
                        path, f"{sandbox.engine_name} container {sandbox.container}")
                    break
                except OSError:
                    pass
            state = await sandbox.state()
            if state is not None and not state.running:
                raise await sandbox.explain(None, starting=True)
            if time.monotonic() > deadline:
                raise CouldNotRunError(f"the sandbox agent did not start within "
                                       f"{_CONNECT_TIMEOUT_S:.0f} s in {sandbox.image!r}",
                                       retryable=True)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        return await sandbox.channel.hello()

    # --- a session that outlives its client (sandbox.lifetime) ----------------------------
    async def _attach(self, sandbox: ContainerSandbox, handle: SessionHandle) -> dict[str, Any]:
        try:
            await adopt_running(sandbox, handle.sandbox)
            self.workspace_id = identity(sandbox.workspace)
            self._socket_dir = os.path.dirname(handle.socket)
            sandbox.channel = await sandbox.lifetime.open_channel(
                handle.socket, f"{sandbox.engine_name} container {sandbox.container}")
            return await sandbox.channel.hello()
        except BaseException:
            # nothing of the session is ours to end: the backend's clean-up after a failed
            # open must find no container, channel or socket directory to remove
            channel, sandbox.channel = sandbox.channel, None
            await sandbox.lifetime.let_go(channel)
            sandbox.container = self._socket_dir = None
            raise

    async def detach(self, sandbox: ContainerSandbox) -> None:
        """Leave the container and its jobs running; close only this client's parts."""
        channel, sandbox.channel = sandbox.channel, None
        await sandbox.lifetime.let_go(channel)
        self._socket_dir = None  # the agent still listens there
        sandbox.container = None
        await asyncio.to_thread(sandbox.engine.close)

    async def keep_state(self, sandbox: ContainerSandbox) -> None:
        """Nothing: the workspace is the host dir itself (copy mode keeps a baseline)."""

    def exit_reason(self, exit_code: int | None) -> str | None:
        """Nothing but a crash or a kill ends a bind-mode agent: no sentence of its own."""
        return None

    def pack_upload(self, local: str, name: str, archive: IO[bytes]) -> None:
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.add(local, arcname=name)

    def uploaded(self, archive: str, parent: str) -> None:
        """The workspace is the host dir: nothing to remember."""

    async def sync(self, sandbox: ContainerSandbox) -> SyncReport:
        return SyncReport()  # the sandbox works in the host dir itself

    async def closing(self, sandbox: ContainerSandbox) -> None:
        pass

    async def finish(self, sandbox: ContainerSandbox) -> None:
        """Nothing to bring home."""

    async def clean_up(self, sandbox: ContainerSandbox) -> None:
        slot, self._slot = self._slot, None
        if slot is None and sandbox.awaiting_workspace:
            slot = sandbox.workspace  # never handed out: the empty slot
        if slot is not None:
            slots = self.slots
            await in_engine_thread(lambda: release_slot(slots, slot))
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None


def identity(path: str) -> tuple[int, int] | None:
    """Which directory a path names now (device, inode); None when it names nothing."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def socket_owner(endpoint: str) -> int | None:
    """The uid container root maps to: the owner of a local engine socket (rootless podman)."""
    if not endpoint.startswith("unix://"):
        return None
    try:
        return os.stat(endpoint.removeprefix("unix://")).st_uid
    except OSError:
        return None


