"""What a newcomer to the Ray path is told when they get something wrong (issue 46, item 5):
the name they wrote, in the terms of the interface they used, and what to do. No cluster
needed: each is refused before anything reaches one."""

from __future__ import annotations

from typing import Any

import pytest

from toolseam.integrations.ray_sandbox import RaySandbox, create
from toolseam.ray.cluster import refused_message
from toolseam.ray.node_config import NodeConfig
from toolseam.seam.errors import ConfigurationError


def test_a_misspelt_create_option_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError) as refused:
        create(imgae="localhost/toolseam-sandbox:latest")
    text = str(refused.value)
    assert "ray_sandbox.create() does not take 'imgae'" in text
    assert "image" in text and "ttl_seconds" in text


def test_rays_own_runtime_options_are_not_refused() -> None:
    """ray.experimental.sandbox.create's gVisor options pass the check (they reach the
    network check after it, which a real create would pass too)."""
    with pytest.raises(ConfigurationError, match="network 'host' is not offered"):
        create(image="x", rootless=False, readonly=True, dns=["1.1.1.1"], capabilities=[],
               timeout_seconds=30, network="host")


@pytest.mark.parametrize(("method", "args", "kwargs", "named"), [
    ("exec", (), {"cmd": "ls"}, "unexpected keyword argument 'cmd'"),
    ("exec", (), {}, "missing 1 required positional argument: 'command'"),
    ("read_file", ("a", "b"), {}, "takes 1 positional argument but 2 were given"),
    ("write_file", ("a",), {}, "missing 1 required positional argument: 'content'"),
])
def test_a_wrong_call_names_the_method_as_it_was_called(
        method: str, args: tuple[Any, ...], kwargs: dict[str, Any], named: str) -> None:
    sandbox = RaySandbox(actor=None, node_id="n" * 56, env=None, workdir=None,
                         orphan_timeout_s=120)
    with pytest.raises(TypeError) as wrong:
        getattr(sandbox, method).remote(*args, **kwargs)
    text = str(wrong.value)
    assert text.startswith(f"sandbox.{method}.remote(") and named in text
    assert "_args" not in text  # never the helper's own name


@pytest.mark.parametrize("engine", ["docker", "podman", "podman-rootless", "host"])
def test_a_misspelt_node_option_names_the_variable_and_what_it_takes(
        engine: str, tmp_path: Any) -> None:
    config = NodeConfig.from_env({"TOOLSEAM_RAY_BACKEND": engine,
                                  "TOOLSEAM_RAY_BACKEND_OPTIONS": '{"imgae": "x"}'})
    with pytest.raises(ConfigurationError) as refused:
        config.make(str(tmp_path), None, None)
    text = str(refused.value)
    assert "TOOLSEAM_RAY_BACKEND_OPTIONS" in text and "'imgae'" in text
    assert f"the {engine} backend" in text
    if engine != "host":
        assert "image" in text and "endpoint" in text


def test_a_driver_the_cluster_refuses_is_told_what_to_set() -> None:
    text = refused_message("127.0.0.1:6379", ConnectionError("Failed to connect"))
    assert "127.0.0.1:6379" in text and "RAY_AUTH_MODE=token" in text
    assert "~/.ray/auth_token" in text and "RAY_AUTH_MODE is" in text


def test_no_cluster_at_all_says_how_to_name_one() -> None:
    text = refused_message("auto", ConnectionError("Could not find any running Ray instance"))
    assert "RAY_ADDRESS" in text and "address=" in text and "Starting a cluster" in text
