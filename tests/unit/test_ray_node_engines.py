"""A Ray node's engine (``TOOLSEAM_RAY_BACKEND``) is a local kind of the one backend table
(issue 47): the node makes its backend through the table, a variant brings its options, and a
name the table has no local kind for is refused, listing the ones it has."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolseam.backends.docker import DockerBackend
from toolseam.backends.host import HostBackend
from toolseam.backends.podman import PodmanBackend
from toolseam.ray.node_config import ENGINES, NodeConfig
from toolseam.seam.errors import ConfigurationError


def node(engine: str, options: str = "{}") -> NodeConfig:
    return NodeConfig.from_env({"TOOLSEAM_RAY_BACKEND": engine, "TOOLSEAM_RAY_NODE_NAME": "n1",
                                "TOOLSEAM_RAY_BACKEND_OPTIONS": options})


def test_the_engines_are_the_tables_local_names() -> None:
    assert ENGINES == ("docker", "host", "podman", "podman-rootless")
    for refused in ("ray", "lxc"):  # a node does not host a Ray session of its own
        with pytest.raises(ConfigurationError, match=f"TOOLSEAM_RAY_BACKEND is {refused!r}, "
                           "not one of docker, host, podman, podman-rootless"):
            node(refused)


def test_a_container_engine_is_made_through_the_table() -> None:
    made_by = {"podman-rootless": (PodmanBackend, True), "podman": (PodmanBackend, None),
               "docker": (DockerBackend, None)}  # a loop, not parameters: no engine is asked
    for engine, (made, rootless) in made_by.items():
        config = node(engine, '{"endpoint": "unix:///nowhere.sock"}')
        assert config.contained and config.describe() == f"{engine} at unix:///nowhere.sock"
        cls, options = config.container_factory("img:1", None)
        assert cls is made
        assert options.get("rootless") == rootless
        backend = config.make("/nonexistent", None, None)  # made, not opened
        assert type(backend) is made and backend.name == engine


def test_the_host_engine_is_the_nodes_own_processes(tmp_path: Path) -> None:
    config = node("host", '{"image": "ignored"}')
    assert not config.contained and config.describe() == "the host backend"
    assert type(config.make(str(tmp_path), "img", None)) is HostBackend


def test_an_option_the_engine_does_not_take_is_refused_by_the_variables_name() -> None:
    with pytest.raises(ConfigurationError, match="has 'rootless', which the docker backend does "
                       r"not take; it takes: .*tls_dir"):
        node("docker", '{"rootless": true}').make("/nonexistent", None, None)
    with pytest.raises(ConfigurationError, match="which the podman backend does not take"):
        node("podman", '{"tls_dir": "/x"}').make("/nonexistent", None, None)
