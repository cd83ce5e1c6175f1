"""Host backend: nothing outlives a session, a dead host, or a flood's memory bound."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from toolseam import OutputEvent, Settings, Toolkit, ToolResult

from ..support.processes import host_started, host_survivors

REPO = Path(__file__).resolve().parents[2]


def _marker() -> str:
    return f"{uuid.uuid4().int % 900 + 100}.{uuid.uuid4().int % 90 + 10}"


async def test_session_close_leaves_no_process(tmp_path: Path) -> None:
    marker = _marker()
    tk = Toolkit("host", base_dir=str(tmp_path),
                 settings=Settings(timeout_policy="detach", default_timeout_ms=100))
    detached = await tk.call("bash", {"command": f"sleep {marker} & setsid sleep {marker} & wait",
                                      "keep": True})
    assert detached.metadata["detached"] is True
    assert len(host_survivors(f"sleep {marker}")) == 3  # the shell and its two sleeps
    await tk.close()
    assert host_survivors(f"sleep {marker}") == []
    assert [p for p in psutil.Process().children(recursive=True)
            if "--toolseam-agent" in " ".join(p.cmdline())] == []


async def test_sigkilled_host_leaves_no_process(tmp_path: Path) -> None:
    marker = _marker()
    holder = subprocess.Popen([sys.executable, str(REPO / "tests/support/hold_job.py"), "host",
                               str(tmp_path), marker], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert holder.stdout is not None
    try:
        json.loads(holder.stdout.readline())
        assert host_started(f"sleep {marker}")
    finally:  # killed here, or by a failure above: never left running for the next test
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    deadline = time.monotonic() + 5
    while host_survivors(f"sleep {marker}") and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert host_survivors(f"sleep {marker}") == []


async def test_flood_keeps_both_sides_bounded(tmp_path: Path) -> None:
    me = psutil.Process()
    before = me.memory_info().rss
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        result = await tk.call("bash", {"command": "yes", "timeout": 2500})
        agents = [p for p in me.children(recursive=True) if "--toolseam-agent" in " ".join(p.cmdline())]
        agent_rss = max(p.memory_info().rss for p in agents)
    assert result.metadata["stdoutBytes"] > 200 * (1 << 20)  # far more than was kept
    assert result.metadata["stdoutTruncated"] is True
    assert len(result.output.encode()) < (1 << 20) + 200
    assert agent_rss < 64 << 20
    assert me.memory_info().rss - before < 64 << 20


async def test_call_stream_yields_events_then_the_result(tmp_path: Path) -> None:
    async with Toolkit("host", base_dir=str(tmp_path), session_id="s1") as tk:
        items = [item async for item in tk.call_stream(
            "bash", {"command": "echo a; sleep 0.05; echo b >&2; sleep 0.05; echo c"}, call_id="c9")]
    events, result = items[:-1], items[-1]
    assert [(e.stream, e.text) for e in events if isinstance(e, OutputEvent)] == [
        ("stdout", "a\n"), ("stderr", "b\n"), ("stdout", "c\n")]
    assert all(isinstance(e, OutputEvent) and (e.session, e.call) == ("s1", "c9") for e in events)
    assert isinstance(result, ToolResult) and result.output == "a\nb\nc\n"


async def test_leaving_call_stream_early_kills_the_command(tmp_path: Path) -> None:
    marker = _marker()
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        stream = tk.call_stream("bash", {"command": f"echo go; sleep {marker}"})
        first = await stream.__anext__()
        assert isinstance(first, OutputEvent) and first.text == "go\n"
        await stream.aclose()
        assert host_survivors(f"sleep {marker}") == []


async def test_agent_refuses_an_environment_it_was_never_sent(tmp_path: Path) -> None:
    """The env cache is by id: an id the agent does not know is a protocol fault, never a
    command run with some other environment."""
    from toolseam.backends.host import HostBackend
    from toolseam.seam.errors import CouldNotRunError

    backend = HostBackend(str(tmp_path))
    await backend.open()
    try:
        spec = {"argv": ["/bin/sh", "-c", "env"], "cwd": str(tmp_path), "env_id": 99}
        with pytest.raises(CouldNotRunError) as caught:
            await backend._agent().call("start", job="stray", spec=spec, forget=True)
        assert "unknown env_id 99" in caught.value.reason
        result = await Toolkit(backend, base_dir=str(tmp_path)).call("bash", {"command": "echo ok"})
        assert result.output == "ok\n"  # the agent lives on
    finally:
        await backend.close()


async def test_agent_killed_from_outside_ends_the_session_plainly(tmp_path: Path) -> None:
    """Every later call says the session is over, not retryable — not "retry" forever."""
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        launcher = tk.backend.agent.launcher_pid  # type: ignore[attr-defined]  # unshare
        agents = psutil.Process(launcher).children()
        assert len(agents) == 1 and "--toolseam-agent" in " ".join(agents[0].cmdline())
        agents[0].kill()  # NOT tk.info.agent_pid: that is the pid inside the namespace (1)
        await asyncio.sleep(0.2)
        results = [await tk.call("bash", {"command": "true"}) for _ in range(3)]
        grep = await tk.call("grep", {"pattern": "x"})
    for result in [*results, grep]:
        assert result.metadata["failure"] == "could_not_run"
        assert result.metadata["retryable"] is False
        assert result.metadata["reason"].endswith("this session is over (its sandbox is gone): "
                                                  "start a new one")
