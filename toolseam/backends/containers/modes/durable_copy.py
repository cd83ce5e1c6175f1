"""Copy mode for a session that outlives its client (docs/sessions.md).

The agent (the container's pid 1) is a durable agent on an abstract unix socket inside the
container (``@toolseam-agent-SESSION``: no file a command could remove). A client on any machine
that reaches the engine connects through an engine ``exec`` of the relay
(``containers/exec_stream.py``, ``toolseam_agent/relay.py``): the engine's attach stream to the
agent's stdin is not used, so a closed or dropped connection ends one relay, never the agent —
podman closes a container's stdin whenever an attach ends.

What the copy-back needs — the baseline of what was copied in — is kept with the agent as the
session's ``copy`` state (after the copy-in, each sync and each upload), so whichever process
closes the session last brings the work home, through ``CopyMode.finish`` as always (a failed
copy-back keeps the container and says how to recover it). The container is not auto-removed,
for that copy-back from the stopped container: after an orphan timeout the stopped container
and its workspace volume are removed by the janitor of the next session on that engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from typing import Any, Literal

from toolseam_agent.attach_auth import KEY_VAR

from ....seam.errors import CouldNotRunError
from ....seam.handle import AttachError, SessionHandle
from ....seam.models import SyncReport
from ...agentlink.durable import DurableChannel, durable_agent_env
from ..bundle.staged import bundle_command
from ..engine.exec_stream import exec_channel
from ..engine.protocol import ContainerSpec
from ..labels import AGENT_MOUNT, CLOSING_LABEL, OWNER_LABEL, SESSION_LABEL, owner_label
from ..options import SetidFiles
from ..sandbox import ContainerSandbox, adopt_running
from ..workspace_sync.policy import Entry
from ..workspace_sync.tar_sync import WorkspaceCopy
from .copy import CopyMode
from .durable_bind import durable_labels

ADDRESS_PREFIX = "@toolseam-agent-"
_LISTEN_TIMEOUT_S = 15.0


class DurableCopyMode(CopyMode):
    def __init__(self, copy_limit: int, keep_group_write: bool, secret: str,
                 orphan_timeout_s: float, adopt: SessionHandle | None,
                 setid_files: SetidFiles = None) -> None:
        super().__init__(copy_limit, keep_group_write, setid_files)
        self._secret = secret
        self._orphan_timeout_s = orphan_timeout_s
        self._adopt = adopt
        self.socket_path = adopt.socket if adopt is not None else ""
        self._copy_changed = True  # the baseline moved since the agent got it

    # --- the container: a durable agent, no stdin ------------------------------------------
    async def start(self, sandbox: ContainerSandbox, bundle: str, labels: dict[str, str]
                    ) -> dict[str, Any]:
        if self._adopt is not None:
            return await self._attach_existing(sandbox, self._adopt)
        self.socket_path = f"{ADDRESS_PREFIX}{sandbox.session_id}"
        hello = await super().start(sandbox, bundle, labels)
        await self.save_copy(sandbox)
        return hello

    def finish_spec(self, spec: ContainerSpec) -> ContainerSpec:
        return dataclasses.replace(
            spec, command=[*spec.command, "--durable", self.socket_path], stdin_open=False,
            labels=durable_labels(spec.labels, self._orphan_timeout_s),
            environment={**spec.environment,
                         **durable_agent_env(self._secret, self._orphan_timeout_s)})

    async def _attach(self, sandbox: ContainerSandbox) -> None:
        """Each connection: an exec of the relay into the agent's socket."""
        assert sandbox.container is not None
        container, address = sandbox.container, sandbox.engine.address
        attach_path = sandbox.engine.attach_path(container)
        relay = [*bundle_command(AGENT_MOUNT), "--relay", self.socket_path]

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
                sandbox.channel = await DurableChannel.attach(self.socket_path, label,
                                                              self._secret, connect)
                break
            except CouldNotRunError:
                state = await sandbox.state()
                if time.monotonic() > deadline or state is None or not state.running:
                    raise
                await asyncio.sleep(0.05)
        if old is not None:
            sandbox.channel.adopt_listeners(old)

    def exit_reason(self, exit_code: int | None) -> str | None:
        return None  # no attach stream ends this agent: an exit is its own, or its timeout

    # --- close: the copy-back from the stopped container ---------------------------------------
    async def closing(self, sandbox: ContainerSandbox) -> None:
        """Mark the session closing by this process before its agent stops the container: the
        container has no owner (any client may attach), and a janitor of another session on
        this engine would take a stopped one for a session that ended by itself — and remove
        it under this copy-back (seen in the suite, two workers on one engine)."""
        labels = {CLOSING_LABEL: "1", OWNER_LABEL: owner_label(),
                  SESSION_LABEL: sandbox.session_id}
        with contextlib.suppress(CouldNotRunError):  # without it the copy-back goes on
            await asyncio.to_thread(sandbox.engine.create_volume, _closing_marker(sandbox),
                                    labels)

    async def clean_up(self, sandbox: ContainerSandbox) -> None:
        await super().clean_up(sandbox)
        with contextlib.suppress(CouldNotRunError):
            await asyncio.to_thread(sandbox.engine.remove_volume, _closing_marker(sandbox))

    # --- attach ------------------------------------------------------------------------------
    async def _attach_existing(self, sandbox: ContainerSandbox, handle: SessionHandle
                               ) -> dict[str, Any]:
        session = handle.socket.removeprefix(ADDRESS_PREFIX)
        try:
            await adopt_running(sandbox, handle.sandbox)
            await self._attach(sandbox)
            assert isinstance(sandbox.channel, DurableChannel)
            saved = sandbox.channel.kept_state("copy")
            if not isinstance(saved, dict):
                raise AttachError("protocol", "the session kept no copy-back baseline")
            self.copy = _restore_copy(saved, handle.workspace)
            self.workspace_volume = f"toolseam-ws-{session}"
            sandbox.session_id = session
            return await sandbox.channel.hello()
        except BaseException:
            channel, sandbox.channel = sandbox.channel, None  # nothing here is ours to end
            if isinstance(channel, DurableChannel):
                await channel.detach()
            sandbox.container = None
            self.copy = self.workspace_volume = None
            raise

    async def detach(self, sandbox: ContainerSandbox) -> None:
        await self.save_copy(sandbox)
        channel, sandbox.channel = sandbox.channel, None
        if isinstance(channel, DurableChannel):
            await channel.detach()
        sandbox.container = None
        self.copy = self.workspace_volume = None  # the next client's to finish and clean up
        await asyncio.to_thread(sandbox.engine.close)

    # --- the copy-back baseline, kept with the agent ----------------------------------------
    async def save_copy(self, sandbox: ContainerSandbox) -> None:
        """Give the agent the copy-back baseline when it changed."""
        channel = sandbox.channel
        if self.copy is None or not isinstance(channel, DurableChannel) or \
                not self._copy_changed:
            return
        try:
            await channel.put_state(_copy_state(self.copy), key="copy")
        except CouldNotRunError:
            return
        self._copy_changed = False

    async def sync(self, sandbox: ContainerSandbox) -> SyncReport:
        report = await super().sync(sandbox)
        self._copy_changed = True
        await self.save_copy(sandbox)
        return report

    def uploaded(self, archive: str, parent: str) -> None:
        super().uploaded(archive, parent)
        self._copy_changed = True  # saved with the toolkit's state after the call


def _copy_state(copy: WorkspaceCopy) -> dict[str, Any]:
    return {"limit": copy.limit, "keep_group_write": copy.keep_group_write,
            "baseline": {rel: dataclasses.astuple(entry) for rel, entry in copy.baseline.items()},
            "copies": {rel: [path, list(stamp)] for rel, (path, stamp) in copy.copies.items()}}


def _restore_copy(saved: dict[str, Any], workspace: str) -> WorkspaceCopy:
    copy = WorkspaceCopy(workspace, int(saved["limit"]),
                         keep_group_write=bool(saved["keep_group_write"]))
    for rel, (kind, mode, digest, size, stamp) in saved["baseline"].items():
        kind_: Literal["file", "dir", "link"] = kind
        copy.baseline[rel] = Entry(kind_, int(mode), str(digest), int(size),
                                   None if stamp is None else (int(stamp[0]), int(stamp[1])))
    for rel, (path, stamp) in saved["copies"].items():
        copy.copies[rel] = (str(path), (int(stamp[0]), int(stamp[1])))
    return copy


def _closing_marker(sandbox: ContainerSandbox) -> str:
    return f"toolseam-closing-{sandbox.session_id}"
