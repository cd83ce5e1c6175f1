"""A sandbox that dies under a call is told apart from a command that failed (issue 49): the
call raises ``CouldNotRunError`` with ``cause == "sandbox_lost"`` — never an ordinary result
("exited with code -15") and never "its container still runs" — on every engine, whether the
container is removed or stopped from outside."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from toolseam import CouldNotRunError, SessionReport, Toolkit

from ..support.engines import ALL_ENGINES, ENGINES, backend, endpoint

pytestmark = pytest.mark.engines
SLEEP = ": > started; sleep 30"  # a shell with a child, as an agent's command would be


def _engine_cli(engine: str) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    if engine == "docker":
        return ["/usr/bin/docker", "-H", endpoint(engine)], env
    env["CONTAINER_HOST"] = endpoint(engine)
    return ["podman", "--remote"], env


def _through_the_api(sandbox: Any, how: str) -> None:
    """Stop or remove the container with the engine's own API, as another client would."""
    container = sandbox.sandbox.container
    client = sandbox.sandbox.engine.client
    if hasattr(client, "api") and hasattr(client.api, "remove_container"):  # docker SDK
        if how == "rm":
            client.api.remove_container(container, force=True)
        else:
            client.api.stop(container, timeout=2)
        return
    found = client.containers.get(container)  # podman-py
    if how == "rm":
        found.remove(force=True)
    else:
        found.stop(timeout=2)


async def _from_outside(engine: str, sandbox: Any, how: str) -> None:
    if engine in ENGINES:  # the engine's CLI, as an operator types it
        cli, env = _engine_cli(engine)
        verb = ["rm", "-f"] if how == "rm" else ["stop", "-t", "2"]
        done = await asyncio.to_thread(subprocess.run, [*cli, *verb, sandbox.sandbox.container],
                                       capture_output=True, env=env, check=False)
        assert done.returncode == 0, done.stderr
    else:
        await asyncio.to_thread(_through_the_api, sandbox, how)


async def _running(tk: Toolkit) -> None:
    """Until the call's command is seen running inside (a condition, not a sleep)."""
    for _ in range(200):
        probe = await tk.sandbox.exec(["test", "-e", f"{tk.base_dir}/started"])
        if probe.exit_code == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the command never started")


@pytest.mark.parametrize("how", ["rm", "stop"])
@pytest.mark.parametrize("engine", ALL_ENGINES)
async def test_container_gone_under_a_call_is_sandbox_lost(engine: str, how: str,
                                                           workspace: Path) -> None:
    sandbox = backend(engine, str(workspace))
    tk = Toolkit(sandbox, raise_could_not_run=True)
    await tk.open()
    call = asyncio.ensure_future(tk.call("bash", {"command": SLEEP}))
    try:
        await _running(tk)
        await _from_outside(engine, sandbox, how)
        with pytest.raises(CouldNotRunError) as caught:
            await asyncio.wait_for(call, 25)
        assert caught.value.cause == "sandbox_lost", caught.value.reason
        assert "still runs" not in caught.value.reason
        with pytest.raises(CouldNotRunError) as again:  # every later call says the same
            await tk.call("read", {"path": "x"})
        assert again.value.cause == "sandbox_lost" and not again.value.retryable
    finally:
        call.cancel()
        closing = await asyncio.gather(tk.close(), return_exceptions=True)
    if engine in ENGINES or how == "stop":
        (report,) = closing
        assert isinstance(report, SessionReport), report
        assert report.calls == {"could_not_run": 2}  # the host counts what the RL trainer drops
        return
    # copy mode: the changes lived in the removed container's volume, which is kept
    failure = closing[0]
    assert isinstance(failure, CouldNotRunError) and failure.cause == "copy_back_failed"
    assert "was removed from the engine" in failure.reason and "toolseam recover" not in \
        failure.reason
    await asyncio.to_thread(_drop_kept_volume, sandbox)


def _drop_kept_volume(sandbox: Any) -> None:
    engine = sandbox.sandbox.engine
    for name in (f"toolseam-ws-{sandbox.sandbox.session_id}",
                 f"toolseam-kept-{sandbox.sandbox.session_id}"):
        engine.remove_volume(name)


@pytest.mark.parametrize("engine", ["podman", "docker"])
async def test_lost_sandbox_reads_as_words_for_the_model(engine: str, workspace: Path) -> None:
    """Without raise_could_not_run the model reads a sentence; the host reads the cause."""
    sandbox = backend(engine, str(workspace))
    async with Toolkit(sandbox) as tk:
        call = asyncio.ensure_future(tk.call("bash", {"command": SLEEP}))
        await _running(tk)
        await _from_outside(engine, sandbox, "rm")
        result = await asyncio.wait_for(call, 25)
    assert result.is_error and result.metadata["cause"] == "sandbox_lost"
    assert result.model_text().startswith("bash: could not run: ")
    assert "exited with code" not in result.output
