"""The ``toolseam`` inspect_ai provider's own behaviour: registration through the entry point,
its config, each sample's workspace and lifecycle, cleanup (per sample, per task, from the CLI)
leaving no container, volume, workspace or process, and inspect's exec error types."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxEnvironmentSpec,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
)
from inspect_ai.util._sandbox.limits import override_max_exec_output_size

from toolseam.frontends.inspect import ToolseamSandboxConfig, ToolseamSandboxEnvironment
from toolseam.frontends.inspect._cleanup import _local_engines
from toolseam.seam.errors import ConfigurationError

from ..support.engines import IMAGE, endpoint

INSPECT = str(Path(sys.executable).with_name("inspect"))


def test_the_entry_point_registers_the_sandbox_type() -> None:
    """A fresh interpreter that never imports toolseam finds ``toolseam`` through inspect."""
    code = ("from inspect_ai.util._sandbox.registry import registry_find_sandboxenv as find\n"
            "print(find('toolseam').__module__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "toolseam.frontends.inspect._provider"


def test_config_comes_from_a_dict_and_hashes() -> None:
    spec = SandboxEnvironmentSpec.model_validate({"type": "toolseam", "config": {
        "backend": "docker", "image": "img", "settings": {"output_limit_bytes": 4096},
        "limits": {"memory": "256m"}}})
    assert spec.config == ToolseamSandboxConfig(backend="docker", image="img",
                                                settings={"output_limit_bytes": 4096},
                                                limits={"memory": "256m"})  # type: ignore[arg-type]
    hash(spec)  # inspect caches sandboxes by spec: a dict field made this a TypeError
    with pytest.raises(ValueError, match="colour"):
        ToolseamSandboxConfig.model_validate({"backend": "podman", "colour": "red"})


async def test_a_bad_config_fails_at_task_init() -> None:
    with pytest.raises(ConfigurationError, match="image"):
        await ToolseamSandboxEnvironment.task_init("t", ToolseamSandboxConfig(backend="host",
                                                                              image="x"))
    with pytest.raises(ConfigurationError, match="output_limit_bytes"):
        await ToolseamSandboxEnvironment.task_init("t", ToolseamSandboxConfig(
            backend="host", settings={"output_limit_bytes": "big"}))


async def test_host_sample_lifecycle_leaves_nothing() -> None:
    config = ToolseamSandboxConfig(backend="host")
    envs = await ToolseamSandboxEnvironment.sample_init("t", config, {})
    env = envs["default"]
    assert isinstance(env, ToolseamSandboxEnvironment)
    await env.write_file("sub/a.txt", "hi")
    assert (Path(env.workspace) / "sub" / "a.txt").read_text() == "hi"
    assert (await env.exec(["pwd"])).stdout == env.workspace + "\n"
    launcher = env.toolkit.backend.agent.launcher_pid  # type: ignore[attr-defined]
    assert launcher is not None
    tree = [psutil.Process(launcher), *psutil.Process(launcher).children(recursive=True)]
    await ToolseamSandboxEnvironment.sample_cleanup("t", config, envs, False)
    assert not os.path.exists(env.workspace)
    assert [p.pid for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []


async def test_a_config_whose_settings_keep_the_session_opens_it_durable() -> None:
    """``settings: {orphan_timeout_s: N}`` made the sample's session durable before lifetimes
    were chosen at construction (issue 47); the provider now builds the backend with that
    lifetime instead of refusing the config."""
    config = ToolseamSandboxConfig(backend="host", settings={"orphan_timeout_s": 30})
    await ToolseamSandboxEnvironment.task_init("t", config)
    envs = await ToolseamSandboxEnvironment.sample_init("t", config, {})
    env = envs["default"]
    assert isinstance(env, ToolseamSandboxEnvironment)
    try:
        assert env.toolkit.handle is not None  # a durable session has a handle
        assert (await env.exec(["echo", "kept"])).stdout == "kept\n"
    finally:
        await ToolseamSandboxEnvironment.sample_cleanup("t", config, envs, False)


async def test_exec_raises_what_inspect_documents() -> None:
    config = ToolseamSandboxConfig(backend="host")
    envs = await ToolseamSandboxEnvironment.sample_init("t", config, {})
    env = envs["default"]
    try:
        with pytest.raises(TimeoutError) as timed_out:
            await env.exec(["sh", "-c", "echo partial; sleep 30"], timeout=1)
        assert timed_out.value.truncated_output == "partial\n"  # type: ignore[attr-defined]
        with override_max_exec_output_size(1000), pytest.raises(OutputLimitExceededError) as big:
            await env.exec(["sh", "-c", "head -c 5000 /dev/zero"])
        assert "1000 bytes" in str(big.value) and big.value.truncated_output is not None
        unknown = await env.exec(["id"], user="no-such-user-here")
        assert not unknown.success and "no-such-user-here" in unknown.stderr
        missing = await env.exec(["no-such-program-here"])
        assert missing.returncode == 127 and not missing.success
    finally:
        await ToolseamSandboxEnvironment.sample_cleanup("t", config, envs, False)


def _ours_on_engines() -> list[tuple[str, str]]:
    found = []
    for engine in _local_engines():
        try:
            found += [(c, labels.get("toolseam.session", "")) for c, labels in
                      engine.labeled("toolseam.owner")
                      if labels.get("toolseam.session", "").startswith("inspect-")]
            found += [(v, labels.get("toolseam.session", "")) for v, labels in
                      engine.labeled_volumes("toolseam.owner")
                      if labels.get("toolseam.session", "").startswith("inspect-")]
        finally:
            engine.close()
    return found


def _podman_rootless(**fields: object) -> ToolseamSandboxConfig:
    return ToolseamSandboxConfig(backend="podman", rootless=True, image=IMAGE,
                                 endpoint=endpoint("podman-rootless"), **fields)  # type: ignore[arg-type]


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_container_sample_works_in_its_own_workspace(tmp_path: Path) -> None:
    """Regression: the workspace option was not passed, so the container bind-mounted the
    current directory (the checkout) and the eval's files landed there."""
    config = _podman_rootless()
    before = set(os.listdir(os.getcwd()))
    envs = await ToolseamSandboxEnvironment.sample_init("t", config, {})
    env = envs["default"]
    assert isinstance(env, ToolseamSandboxEnvironment)
    try:
        assert os.stat(env.workspace).st_mode & 0o077 == 0  # the engine user's, no one else's
        await env.write_file("probe.txt", "in the sample")
        assert (Path(env.workspace) / "probe.txt").read_text() == "in the sample"
        assert set(os.listdir(os.getcwd())) == before
        with pytest.raises(SandboxUserUnsupportedError, match="CAP_SETUID"):
            await env.exec(["id"], user="nobody")
        assert (await env.exec(["whoami"], user="root")).stdout == "root\n"
        connection = await env.connection()
        assert connection.container and connection.command.startswith("podman --url ")
    finally:
        await ToolseamSandboxEnvironment.sample_cleanup("t", config, envs, False)
    assert not os.path.exists(env.workspace)
    assert [s for _, s in _ours_on_engines() if s == env.toolkit.session_id] == []


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_task_cleanup_closes_what_an_interrupted_task_left() -> None:
    config = ToolseamSandboxConfig(backend="docker", image=IMAGE, endpoint=endpoint("docker"),
                                   workspace_mode="copy")
    envs = await ToolseamSandboxEnvironment.sample_init("interrupted", config, {})
    env = envs["default"]
    assert isinstance(env, ToolseamSandboxEnvironment)
    session = env.toolkit.session_id
    assert [s for _, s in _ours_on_engines() if s == session]  # container and volume
    await ToolseamSandboxEnvironment.task_cleanup("interrupted", config, True)
    assert [s for _, s in _ours_on_engines() if s == session] == []
    assert not os.path.exists(env.workspace)


_ENDED_EVAL = """
import asyncio, json, os, sys
from toolseam.frontends.inspect import ToolseamSandboxConfig, ToolseamSandboxEnvironment

async def main():
    made = []
    for text in sys.argv[1:]:
        env = (await ToolseamSandboxEnvironment.sample_init(
            "t", ToolseamSandboxConfig.model_validate_json(text), {}))["default"]
        made.append([env.toolkit.session_id, env.workspace])
    print(json.dumps(made), flush=True)
    os._exit(0)  # an eval that ended without its cleanup (--no-sandbox-cleanup, a crash)

asyncio.run(main())
"""


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_inspect_sandbox_cleanup_removes_what_ended_evals_left_and_spares_a_live_one(
        ) -> None:
    configs = [_podman_rootless(),
               ToolseamSandboxConfig(backend="docker", image=IMAGE, endpoint=endpoint("docker"))]
    # the live sample first: its open runs the janitor, which would remove the ended eval's
    # containers itself (their owner is gone) before the command is even tried
    live = (await ToolseamSandboxEnvironment.sample_init("t", configs[1], {}))["default"]
    assert isinstance(live, ToolseamSandboxEnvironment)
    ended = subprocess.run([sys.executable, "-c", _ENDED_EVAL,
                            *(c.model_dump_json() for c in configs)],
                           capture_output=True, text=True, timeout=300, check=True)
    left = {session: workspace for session, workspace in
            json.loads(ended.stdout.strip().splitlines()[-1])}
    try:
        assert set(left) | {live.toolkit.session_id} <= {s for _, s in _ours_on_engines()}
        done = subprocess.run([INSPECT, "sandbox", "cleanup", "toolseam"], capture_output=True,
                              text=True, timeout=300, env=os.environ)
        assert done.returncode == 0, done.stderr
        remaining = {s for _, s in _ours_on_engines()}
        assert set(left).isdisjoint(remaining)
        assert not any(os.path.exists(workspace) for workspace in left.values())
        # a running eval's sample (this process) is spared, and still answers
        assert live.toolkit.session_id in remaining and os.path.isdir(live.workspace)
        assert (await live.exec(["echo", "still here"])).stdout == "still here\n"
    finally:
        await live.close()


TEXT_EDITOR_TASK = '''
from inspect_ai import Task, eval, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import text_editor

USAGE = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)


def say(output):
    return output.model_copy(update={"usage": USAGE})


@task
def edit() -> Task:
    model = get_model("mockllm/model", custom_outputs=[
        say(ModelOutput.for_tool_call("mockllm/model", "text_editor", {
            "command": "create", "path": "/workspace/f.txt", "file_text": "hello"})),
        say(ModelOutput.for_tool_call("mockllm/model", "text_editor", {
            "command": "view", "path": "/workspace/f.txt"})),
        say(ModelOutput.from_content("mockllm/model", "done")),
    ])
    return Task(dataset=[Sample(input="edit", target="done")],
                solver=[use_tools(text_editor()), generate()], scorer=includes(),
                sandbox=("toolseam", CONFIG), model=model)


(log,) = eval(edit(), display="none")
print(log.status, [m.text.splitlines()[-1] for m in log.samples[0].messages if m.role == "tool"])
'''


@pytest.mark.engines  # needs an engine without naming it in a parameter
def test_inspects_injected_tools_work_in_a_container(tmp_path: Path) -> None:
    """Regression: text_editor() installs inspect's tools into /var/tmp, which a read-only root
    filesystem refused ("Read-only file system"); an eval switching from docker must not break."""
    config = {"backend": "podman", "rootless": True, "image": IMAGE,
              "endpoint": endpoint("podman-rootless")}
    (tmp_path / "edit.py").write_text(f"CONFIG = {config!r}\n{TEXT_EDITOR_TASK}")
    done = subprocess.run([sys.executable, "edit.py"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "success ['File created successfully at: /workspace/f.txt', " \
                          "'     1\\thello']\n"


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_a_sandbox_that_died_is_unavailable_not_a_result() -> None:
    config = ToolseamSandboxConfig(backend="podman", image=IMAGE, endpoint=endpoint("podman"))
    envs = await ToolseamSandboxEnvironment.sample_init("t", config, {})
    env = envs["default"]
    assert isinstance(env, ToolseamSandboxEnvironment)
    try:
        sandbox = env.toolkit.backend.sandbox  # type: ignore[attr-defined]
        sandbox.engine.remove(sandbox.container)  # the engine kills it under the eval
        with pytest.raises(SandboxUnavailableError):
            await env.exec(["true"])
        with pytest.raises(SandboxUnavailableError):
            await env.read_file("anything")
    finally:
        await ToolseamSandboxEnvironment.sample_cleanup("t", config, envs, True)
    assert not os.path.exists(env.workspace)
