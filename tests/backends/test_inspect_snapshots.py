"""inspect_ai and toolseam's snapshots (issue 48, docs/integrations/inspect.md): the installed
inspect gives a provider no checkpoint or snapshot hook to serve — checked here, so the day it
does this fails and says to serve it — and a solver reaches a sample's ``Toolkit`` through
``sandbox().as_type(...)`` to snapshot and restore the sample's files itself."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._checkpoint._snapshot.registry import KNOWN_STRATEGY_NAMES, create_strategy

from toolseam.frontends.inspect import ToolseamSandboxConfig, ToolseamSandboxEnvironment

from ..support.engines import IMAGE, endpoint


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "store"
    monkeypatch.setenv("TOOLSEAM_SNAPSHOTS", str(root))
    return root


def test_inspect_has_no_snapshot_hook_a_provider_could_serve() -> None:
    hooks = [name for name in dir(SandboxEnvironment)
             if any(word in name.lower() for word in ("snapshot", "checkpoint", "restore"))]
    assert hooks == [], f"inspect now has {hooks}: serve them from Toolkit.snapshot/restore"
    assert {"restic-incremental", "archive"} == KNOWN_STRATEGY_NAMES

    @dataclasses.dataclass(frozen=True)
    class ToolseamSnapshots:
        name: str = "toolseam"
    with pytest.raises(ValueError, match="unknown snapshot strategy"):
        create_strategy(ToolseamSnapshots())  # type: ignore[arg-type]


def _config(backend: str) -> ToolseamSandboxConfig:
    if backend == "host":
        return ToolseamSandboxConfig(backend="host")
    return ToolseamSandboxConfig(backend="podman", rootless=True, image=IMAGE,
                                 endpoint=endpoint("podman-rootless"))


@pytest.mark.parametrize("backend", ["host", "podman-rootless"])
async def test_a_solver_snapshots_and_restores_a_sample_through_its_toolkit(
        backend: str) -> None:
    config = _config(backend)
    envs = await ToolseamSandboxEnvironment.sample_init("t", config, {})
    try:
        env = envs["default"].as_type(ToolseamSandboxEnvironment)
        await env.write_file("notes/a.txt", "before\n")
        snap = await env.toolkit.snapshot("before the risky step")
        await env.write_file("notes/a.txt", "after\n")
        assert (await env.exec(["sh", "-c", "rm -r notes && echo new > b.txt"])).success
        await env.toolkit.restore(snap)
        assert await env.read_file("notes/a.txt") == "before\n"
        assert (await env.exec(["ls"])).stdout == "notes\n"
    finally:
        await ToolseamSandboxEnvironment.sample_cleanup("t", config, envs, False)
