"""The one table of backend names (issue 47): ``toolseam.backends.KINDS`` has every backend —
Ray's included —, each kind's class reads its own handle back (``from_handle``), and the CLI,
the front ends' option models and ``SessionHandle`` take their names from it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from toolseam import Toolkit
from toolseam.backends import (
    BACKEND_NAMES,
    BACKENDS,
    KINDS,
    backend_class,
    backend_for_handle,
    backend_kind,
)
from toolseam.backends.host import HostBackend
from toolseam.backends.podman import PodmanBackend
from toolseam.frontends.cli import build_parser
from toolseam.frontends.inspect import ToolseamSandboxConfig
from toolseam.frontends.mcp.server import McpTools, describe
from toolseam.integrations.openai_agents import ToolseamSandboxClientOptions
from toolseam.ray import RayBackend
from toolseam.seam.handle import AttachError, SessionHandle


def handle(backend: str, workspace: str, **fields: object) -> SessionHandle:
    return SessionHandle(backend=backend, socket="/nowhere/agent.sock", sandbox="1",
                         workspace_mode="host" if backend == "host" else "copy",
                         workspace=workspace, session_id="s1", secret="x" * 32, **fields)


def test_every_kind_names_its_class_and_every_open_backend_names_its_kind() -> None:
    assert BACKENDS == ("host", "podman", "docker", "ray")
    for name, kind in KINDS.items():
        assert backend_class(name).__name__ == kind.class_name
    assert backend_class("ray") is RayBackend  # Ray itself is imported only at open
    assert backend_kind(RayBackend().name) is KINDS["ray"]
    assert backend_kind(HostBackend(".").name) is KINDS["host"]
    assert backend_kind(PodmanBackend(".", rootless=True).name) is KINDS["podman"]
    assert {*BACKENDS, "remote", "podman-rootless"} == BACKEND_NAMES  # remote: not by name


def test_each_backend_reads_its_own_handle_back(tmp_path: Path) -> None:
    host = backend_for_handle(handle("host", str(tmp_path), network="egress"), {})
    assert isinstance(host, HostBackend)
    assert (host.workspace, host.network) == (str(tmp_path), "egress")
    rootless = backend_for_handle(handle("podman-rootless", str(tmp_path), image="img:1",
                                         endpoint="unix:///nowhere/podman.sock"), {})
    assert isinstance(rootless, PodmanBackend)  # made, not opened: no engine is asked
    assert rootless.name == "podman-rootless"
    assert rootless.sandbox.engine.endpoint == "unix:///nowhere/podman.sock"


@pytest.mark.parametrize(("name", "words"), [
    ("lxc", "unknown backend 'lxc'; choose one of host, podman, docker, ray"),
])
def test_a_handle_of_a_kind_that_cannot_attach_is_unsupported(tmp_path: Path, name: str,
                                                              words: str) -> None:
    with pytest.raises(AttachError, match=words) as refused:
        backend_for_handle(handle(name, str(tmp_path)), {})
    assert refused.value.reason == "unsupported"


@pytest.mark.parametrize("name", ["", "Host", "host; rm -rf /", "h" * 41])
def test_a_handle_names_its_kind_as_a_plain_word(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValidationError, match="backend"):
        handle(name, str(tmp_path))


def test_the_cli_offers_the_tables_names(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["serve", "--stdio", "--backend", "ray"]).backend == "ray"
    recover = parser.parse_args(["recover", "--backend", "podman", "--list"])
    assert recover.backend == "podman"
    for name, refused in (("lxc", ["serve", "--stdio", "--backend", "lxc"]),
                          *((name, ["recover", "--backend", name, "--list"])
                            for name in ("host", "ray"))):
        with pytest.raises(SystemExit):
            parser.parse_args(refused)
        assert f"invalid choice: {name!r}" in capsys.readouterr().err


def test_the_front_ends_option_models_read_the_table() -> None:
    for model in (ToolseamSandboxConfig, ToolseamSandboxClientOptions):
        schema = model.model_json_schema()["properties"]["backend"]
        assert schema["enum"] == list(BACKENDS), model
        with pytest.raises(ValidationError, match="unknown backend 'lxc'; choose one of"):
            model(backend="lxc")
    assert ToolseamSandboxConfig(backend="ray").backend == "ray"


def test_the_mcp_front_end_serves_a_ray_backend_without_asking_its_name() -> None:
    """It raised ``unknown backend 'ray'``: the table had no row for Ray. Nothing is opened
    here (the front end only reads the kind), so no cluster is needed."""
    toolkit = Toolkit(RayBackend(os.getcwd()))
    text = describe(toolkit)
    assert "They run in a sandbox on a node of a Ray cluster" in text
    tools = McpTools(lambda: Toolkit(RayBackend(os.getcwd())), shared=True)
    listed = asyncio.run(tools.list_tools(None, None))  # type: ignore[arg-type]
    bash = next(tool for tool in listed.tools if tool.name == "bash")
    assert "directly on this machine" not in (bash.description or "")
