"""A container session that outlives its client (docs/sessions.md): the agent is a durable
agent (``toolseam_agent/session_socket.py``) given the key derived from the secret and its
orphan timeout; every connection proves the secret (``agentlink/durable.py``), so a dropped
connection or a dead client no longer ends the sandbox. The container carries no owner label
(whoever attaches is its client; every janitor leaves it alone while it runs) but
``DURABLE_LABEL`` with the timeout, and is removed by the engine when it stops unless its mode
still needs it stopped (copy mode copies back from it).

Where the agent listens and how a connection reaches it are the mode's (a bind-mounted socket,
or an ``exec`` of the relay into an abstract socket); this module is what any mode gets from
the lifetime.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ....seam.errors import ConfigurationError
from ....seam.handle import SessionHandle
from ....seam.lifetime import Durable
from ...agentlink.channel import AgentChannel
from ...agentlink.durable import Connector, DurableChannel, durable_agent_env
from ..engine.protocol import ContainerSpec
from ..labels import DURABLE_LABEL, OWNER_LABEL


def durable_labels(labels: dict[str, str], orphan_timeout_s: float) -> dict[str, str]:
    """A durable container's labels: no owner (whoever attaches is its client; every janitor
    leaves it alone while it runs) and its orphan timeout."""
    return {**{k: v for k, v in labels.items() if k != OWNER_LABEL},
            DURABLE_LABEL: repr(float(orphan_timeout_s))}


class DurableLifetime:
    outlives_client = True

    def __init__(self, option: Durable) -> None:
        self.option = option

    @property
    def adopt(self) -> SessionHandle | None:
        return self.option.adopt

    def agent_args(self, address: str) -> list[str]:
        return ["--durable", address]

    def finish_spec(self, spec: ContainerSpec, *, removed_when_stopped: bool) -> ContainerSpec:
        timeout = self.option.orphan_timeout_s
        return dataclasses.replace(
            spec, auto_remove=removed_when_stopped, labels=durable_labels(spec.labels, timeout),
            environment={**spec.environment, **durable_agent_env(self.option.secret, timeout)})

    async def open_channel(self, address: str, endpoint: str,
                           connector: Connector | None = None) -> AgentChannel:
        return await DurableChannel.attach(address, endpoint, self.option.secret, connector)

    async def let_go(self, channel: AgentChannel | None) -> None:
        if isinstance(channel, DurableChannel):
            await channel.detach()

    async def keep(self, channel: AgentChannel | None, part: str, state: Any) -> bool:
        if not isinstance(channel, DurableChannel):
            return False
        await channel.put_state(state, key=part)
        return True

    def kept(self, channel: AgentChannel | None, part: str) -> Any:
        if not isinstance(channel, DurableChannel):
            raise ConfigurationError("the session is not open as a durable session")
        return channel.kept_state(part)
