"""The official ``mcp`` client speaking the stateless 2026-07-28 protocol (no session, no
handle echoed back) to a real ``toolseam mcp`` process: calls without a handle share the
principal's default sandbox, so files, /tmp and jobs carry over; "new" opens more; a flood from
one principal never locks another out; the least recently used sandbox is closed (its agent
process is gone). Issue 33, item 2."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

from ..support.mcp import TOKENS, TOOLSEAM, client, connect, start_http, stop, text, tokens_file


async def _keeps_state(call: Any) -> None:
    calls = f"/tmp/toolseam-calls-{uuid.uuid4().hex}"  # the host's /tmp is shared by tests
    job = await call("bash", {"command": "sleep 120 # the first call's job"})
    assert not job.is_error, text(job)
    for i in range(200):
        if i % 2:
            done = await call("bash", {"command": f"echo {i} >> {calls} && echo {i} >> kept.txt"})
        else:
            done = await call("write", {"path": f"f{i}.txt", "content": str(i)})
        assert not done.is_error, text(done)
    kept = await call("bash", {"command": f"wc -l < {calls}; rm {calls}; wc -l < kept.txt; "
                                          "ls f*.txt | wc -l"})
    assert text(kept).split() == ["100", "100", "100"], text(kept)
    listed = await call("bash", {"jobs": True})
    assert "the first call's job" in text(listed), text(listed)


async def test_two_hundred_calls_without_a_handle_keep_state_over_http(tmp_path: Path) -> None:
    config = tmp_path.parent / f"{tmp_path.name}-settings.json"
    config.write_text('{"timeout_policy": "detach", "default_timeout_ms": 200}')
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log",
                              "--config", str(config), confine=False)
    try:
        async with connect(url) as one:  # never echoes a handle: a generic client
            await _keeps_state(one.call_tool)
    finally:
        stop(process)


async def test_two_hundred_calls_keep_state_over_stdio(tmp_path: Path) -> None:
    config = tmp_path / "settings.json"
    config.write_text('{"timeout_policy": "detach", "default_timeout_ms": 200}')
    params = StdioServerParameters(command=TOOLSEAM[0], args=[*TOOLSEAM[1:], "mcp", "--base-dir",
                                                              str(tmp_path), "--config", str(config)])
    async with Client(stdio_client(params)) as one:
        await _keeps_state(one.call_tool)


def _agents(server: Any) -> set[int]:
    """The server's sandbox agents (host backend: one process tree per sandbox)."""
    found = set()
    for child in psutil.Process(server.pid).children(recursive=True):
        try:
            if "--toolseam-agent" in child.cmdline():
                found.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


async def test_a_flood_from_one_principal_never_locks_out_another(tmp_path: Path) -> None:
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log",
                              *tokens_file(tmp_path), confine=False)
    try:
        async with client(url, "alice") as alice, client(url, "mallory") as mallory:
            await alice.call_tool("write", {"path": "alice.txt", "content": "mine"})
            before = _agents(process)
            first = await mallory.call_tool("bash", {"command": "true", "sandbox": "new"})
            oldest = _agents(process) - before  # the first handle sandbox's agent
            assert oldest
            for _ in range(100):  # handle-less calls, then sandbox-opening ones
                assert not (await mallory.call_tool("bash", {"command": "true"})).is_error
            for _ in range(40):
                opened = await mallory.call_tool("bash", {"command": "true", "sandbox": "new"})
                assert not opened.is_error, text(opened)
                assert opened.structured_content is not None
                handle = opened.structured_content["sandbox"]
                assert handle in text(opened) or any(
                    handle in getattr(part, "text", "") for part in opened.content)
            # alice is served throughout, her default sandbox intact
            read = await alice.call_tool("read", {"path": "alice.txt"})
            assert not read.is_error and "mine" in text(read), text(read)
            # mallory's least recently used sandbox was closed: its agent process is gone
            deadline = time.monotonic() + 20
            while oldest & _agents(process) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not oldest & _agents(process)
            assert len(_agents(process)) <= 2 * (2 + 16)  # unshare + agent: 2 defaults, 16 more
            gone = await mallory.call_tool("bash", {"command": "true",
                                                    "sandbox": first.structured_content["sandbox"]})
            assert gone.is_error and "no open sandbox has this handle" in text(gone)
    finally:
        stop(process)
    assert set(TOKENS) == {"alice", "mallory"}


def _containers(workspace: Path) -> set[str]:
    """This test's sandbox containers: those that mount its workspace (other tests run too)."""
    import docker

    from ..support.engines import endpoint

    engine = docker.DockerClient(base_url=endpoint("docker"))
    try:
        # sparse: the list's own answer (it has the mounts); otherwise docker-py inspects each
        # container, and one another test removes meanwhile is a 404
        return {c.id for c in engine.containers.list(all=True, sparse=True)
                if any(m.get("Source") == str(workspace) for m in c.attrs.get("Mounts") or ())}
    finally:
        engine.close()


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_two_hundred_calls_keep_state_in_a_docker_sandbox(tmp_path: Path) -> None:
    """docker: handle-less calls share one container (files, /tmp, jobs); "new" makes a second."""
    from ..support.engines import IMAGE, endpoint

    config = tmp_path.parent / f"{tmp_path.name}-settings.json"
    config.write_text('{"timeout_policy": "detach", "default_timeout_ms": 200}')
    tmp_path.chmod(0o777)
    url, process = start_http(tmp_path, tmp_path.parent / f"{tmp_path.name}.log", "--backend",
                              "docker", "--endpoint", endpoint("docker"), "--image", IMAGE,
                              "--pull", "never", "--workspace", str(tmp_path), "--config",
                              str(config), confine=False)
    try:
        async with connect(url) as one:
            await _keeps_state(one.call_tool)
            assert len(_containers(tmp_path)) == 1
            opened = await one.call_tool("bash", {"command": "ls /tmp", "sandbox": "new"})
            assert "toolseam-calls" not in text(opened)  # a sandbox of its own
            assert len(_containers(tmp_path)) == 2
    finally:
        stop(process)
        _remove(_containers(tmp_path))  # what a slow stop left (see the report of issue 33)


def _remove(containers: set[str]) -> None:
    import docker

    from ..support.engines import endpoint

    engine = docker.DockerClient(base_url=endpoint("docker"))
    try:
        for container in containers:
            engine.containers.get(container).remove(force=True)
    finally:
        engine.close()
