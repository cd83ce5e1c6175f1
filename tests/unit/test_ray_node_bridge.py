"""A Ray node refuses the engine's bridge network (toolseam/ray/node_config.py, issue 44): a
sandbox on it could reach the node's own address, where Ray's GCS, raylet and workers listen,
and a client of those runs code on every node. The node's operator may allow it once those
ports are fenced off (``TOOLSEAM_RAY_ALLOW_BRIDGE=1`` in the node's environment)."""

from __future__ import annotations

import pytest

from toolseam.policy.limits import SandboxLimits
from toolseam.ray.node_config import NodeConfig
from toolseam.seam.errors import ConfigurationError


def test_a_node_refuses_the_bridge_naming_itself_and_the_switch() -> None:
    for engine in ("docker", "podman", "podman-rootless"):  # no engine is reached
        node = NodeConfig.from_env({"TOOLSEAM_RAY_BACKEND": engine,
                                    "TOOLSEAM_RAY_NODE_NAME": "n1"})
        with pytest.raises(ConfigurationError, match="node n1 refuses the engine's bridge") as caught:
            node.make("/nonexistent", "img", SandboxLimits(network="bridge"))
        assert "TOOLSEAM_RAY_ALLOW_BRIDGE=1" in str(caught.value)
        for network in ("none", "egress"):  # loopback alone: nothing of the node's is reachable
            node.container_factory("img", SandboxLimits(network=network))


def test_its_operator_may_allow_it() -> None:
    node = NodeConfig.from_env({"TOOLSEAM_RAY_BACKEND": "docker",
                                "TOOLSEAM_RAY_ALLOW_BRIDGE": "1"})
    _, options = node.container_factory("img", SandboxLimits(network="bridge"))
    assert options["limits"].network == "bridge"
