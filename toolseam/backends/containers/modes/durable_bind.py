"""Bind mode for a session that outlives its client (docs/sessions.md).

The agent (the container's pid 1) listens on its unix socket in the bind-mounted socket
directory as a durable agent (``toolseam_agent/session_socket.py``): a connection is one stream
to it, so a dropped connection or a dead client no longer ends the sandbox. The container is
made with the engine's auto-remove and a ``DURABLE_LABEL``: when its agent ends itself after
the orphan timeout, the engine removes the container, and the janitor leaves a running one
alone whoever started it. ``attach`` starts nothing: it checks the container with the engine
and connects to the socket the handle names.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

from toolseam_agent.landlock import DOMAIN_VAR

from ....seam.handle import SessionHandle
from ...agentlink.channel import AgentChannel
from ...agentlink.durable import DurableChannel, durable_agent_env
from ..engine.protocol import ContainerSpec
from ..labels import DURABLE_LABEL, OWNER_LABEL, SOCKET_MOUNT
from ..options import SetidFiles
from ..sandbox import ContainerSandbox, adopt_running
from .bind import BindMode, identity


def durable_labels(labels: dict[str, str], orphan_timeout_s: float) -> dict[str, str]:
    """A durable container's labels: no owner (whoever attaches is its client; every janitor
    leaves it alone while it runs) and its orphan timeout."""
    return {**{k: v for k, v in labels.items() if k != OWNER_LABEL},
            DURABLE_LABEL: repr(float(orphan_timeout_s))}


class DurableBindMode(BindMode):
    def __init__(self, secret: str, orphan_timeout_s: float, adopt: SessionHandle | None,
                 setid_files: SetidFiles = None) -> None:
        super().__init__(setid_files)
        self._secret = secret
        self._orphan_timeout_s = orphan_timeout_s
        self._adopt = adopt

    @property
    def socket_path(self) -> str:
        assert self._socket_dir is not None
        return os.path.join(self._socket_dir, "agent.sock")

    async def save_copy(self, sandbox: ContainerSandbox) -> None:
        """Nothing: bind mode's workspace is the host dir itself (copy mode keeps a baseline)."""

    def agent_args(self, socket_path: str) -> list[str]:
        return ["--durable", socket_path]

    def finish_spec(self, spec: ContainerSpec) -> ContainerSpec:
        # The socket directory is a bind mount clients connect through: no command may make,
        # remove or rename anything in it (toolseam_agent/landlock.py)
        return dataclasses.replace(
            spec, auto_remove=True,
            labels=durable_labels(spec.labels, self._orphan_timeout_s),
            environment={**spec.environment, DOMAIN_VAR: f"scope:{SOCKET_MOUNT}",
                         **durable_agent_env(self._secret, self._orphan_timeout_s)})

    async def open_channel(self, path: str, endpoint: str) -> AgentChannel:
        return await DurableChannel.attach(path, endpoint, self._secret)

    async def start(self, sandbox: ContainerSandbox, bundle: str, labels: dict[str, str]
                    ) -> dict[str, Any]:
        if self._adopt is None:
            return await super().start(sandbox, bundle, labels)
        try:
            return await self._attach(sandbox, self._adopt)
        except BaseException:
            # nothing of the session is ours to end: the backend's clean-up after a failed
            # open must find no container, channel or socket directory to remove
            channel, sandbox.channel = sandbox.channel, None
            if isinstance(channel, DurableChannel):
                await channel.detach()
            sandbox.container = self._socket_dir = None
            raise

    async def _attach(self, sandbox: ContainerSandbox, handle: SessionHandle) -> dict[str, Any]:
        await adopt_running(sandbox, handle.sandbox)
        self.workspace_id = identity(sandbox.workspace)
        self._socket_dir = os.path.dirname(handle.socket)
        sandbox.channel = await self.open_channel(
            handle.socket, f"{sandbox.engine_name} container {sandbox.container}")
        return await sandbox.channel.hello()

    async def detach(self, sandbox: ContainerSandbox) -> None:
        """Leave the container and its jobs running; close only this client's parts."""
        channel, sandbox.channel = sandbox.channel, None
        if isinstance(channel, DurableChannel):
            await channel.detach()
        self._socket_dir = None  # the agent still listens there
        sandbox.container = None
        await asyncio.to_thread(sandbox.engine.close)
