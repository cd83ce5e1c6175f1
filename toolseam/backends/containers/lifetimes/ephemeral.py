"""A container session that ends with its client (the default): the agent serves the one
connection its mode makes, the container carries this process's owner label (a janitor
removes it once this process is gone), and nothing is kept for another client."""

from __future__ import annotations

from typing import Any

from ....seam.errors import ConfigurationError
from ....seam.handle import SessionHandle
from ....seam.lifetime import Ephemeral
from ...agentlink.channel import AgentChannel
from ...agentlink.durable import Connector
from ..engine.protocol import ContainerSpec


class EphemeralLifetime:
    outlives_client = False
    adopt: SessionHandle | None = None  # nothing to attach to: every start is a new sandbox

    def __init__(self, option: Ephemeral) -> None:
        self.option = option

    def agent_args(self, address: str) -> list[str]:
        return ["--listen", address]

    def finish_spec(self, spec: ContainerSpec, *, removed_when_stopped: bool) -> ContainerSpec:
        return spec  # the owner label is there: the janitor ends it after this process

    async def open_channel(self, address: str, endpoint: str,
                           connector: Connector | None = None) -> AgentChannel:
        if connector is not None:
            raise ConfigurationError("an ephemeral session's agent has one connection: its "
                                     "mode's own")
        return await AgentChannel.connect(address, endpoint)

    async def let_go(self, channel: AgentChannel | None) -> None:
        raise ConfigurationError("this backend was built to end with its client "
                                 "(lifetime=Ephemeral): it cannot detach")

    async def keep(self, channel: AgentChannel | None, part: str, state: Any) -> bool:
        return False  # no later client to keep it for

    def kept(self, channel: AgentChannel | None, part: str) -> Any:
        return None
