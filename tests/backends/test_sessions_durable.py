"""Sessions that outlive their client (docs/sessions.md), on every backend that has them:
the host, podman rootful and rootless, docker (bind mode). Real processes and engines."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolseam import (
    AttachError,
    ConfigurationError,
    HostBackend,
    SessionHandle,
    SyncToolkit,
    Toolkit,
)
from toolseam.backends.agentlink.durable import DurableChannel
from toolseam.seam.lifetime import Durable

from ..support.engines import LOCAL_BACKENDS, REMOTE_ENGINES, backend, endpoint
from ..support.processes import host_survivors
from ..support.sessions import attach_options
from ..support.timing import patience

REPO = Path(__file__).resolve().parents[2]
BACKENDS = LOCAL_BACKENDS
REMOTE = REMOTE_ENGINES  # copy mode: another machine's engine
EVERY_LINE = "".join(f"line-{i}\n" for i in range(1, 41)) + "done\n"


def _toolkit(engine: str, workspace: Path, orphan_s: float = 30, **settings: object) -> Toolkit:
    chosen = "host" if engine == "host" else backend(
        engine, str(workspace), lifetime=Durable(orphan_timeout_s=orphan_s))
    return Toolkit(chosen, base_dir=str(workspace) if engine == "host" else None,
                   settings={"orphan_timeout_s": orphan_s, "timeout_policy": "detach",
                             "default_timeout_ms": 60_000, **settings})


def _client(engine: str, workspace: Path, form: str, orphan_s: float, tag: str = ""
            ) -> tuple[subprocess.Popen[str], SessionHandle]:
    """A client process with a call in flight; its handle. ``tag`` goes into the command."""
    if engine != "host":
        endpoint(engine)  # a missing engine: a visible skip here (or a failure in CI)
    client = subprocess.Popen([sys.executable, str(REPO / "tests/support/durable_client.py"),
                               engine, str(workspace), form, str(orphan_s), tag],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert client.stdout is not None
    handle = SessionHandle.from_json(client.stdout.readline())
    if form != "idle":
        assert client.stdout.readline().strip() == "started"
    return client, handle


def _kill(client: subprocess.Popen[str]) -> None:
    client.send_signal(signal.SIGKILL)
    client.wait()
    assert client.stdout is not None
    client.stdout.close()


def _engine_has(handle: SessionHandle) -> bool:
    """Whether the handle's sandbox still exists: its container, or the host agent's socket."""
    if handle.backend == "host":
        return os.path.exists(handle.socket)
    from toolseam.backends.containers.engine.errors import EngineNotFound
    engine = _engine(handle)
    try:
        return engine.state(handle.sandbox).running
    except EngineNotFound:
        return False
    finally:
        engine.close()


def _left_of(engine: Any, handle: SessionHandle) -> tuple[list[str], list[str]]:
    """The containers and volumes the engine still has of the handle's session."""
    from toolseam.backends.containers.labels import SESSION_LABEL
    session = handle.socket.rsplit("-", 1)[-1]
    return ([c for c, labels in engine.labeled(SESSION_LABEL)
             if labels.get(SESSION_LABEL) == session],
            [v for v, labels in engine.labeled_volumes(SESSION_LABEL)
             if labels.get(SESSION_LABEL) == session])


def _engine(handle: SessionHandle) -> Any:
    """The handle's engine, as the tests reach it (copy mode: the remote engines)."""
    name = f"{handle.backend}-remote" if handle.workspace_mode == "copy" else handle.backend
    return backend(name, handle.workspace).sandbox.engine  # type: ignore[attr-defined]


@pytest.mark.parametrize("form", ["long", "stream"])
@pytest.mark.parametrize("engine", BACKENDS + REMOTE)
async def test_killed_client_leaves_a_session_another_process_continues(
        engine: str, form: str, workspace: Path) -> None:
    client, handle = _client(engine, workspace, form, 60)
    _kill(client)  # SIGKILL while the command runs in the foreground of a call
    tk = await Toolkit.attach(handle.to_json(), **attach_options(engine))  # type: ignore[arg-type]
    try:
        assert tk.adopted_jobs == [1]  # the call in flight, now a job
        done = await tk.call("bash", {"wait": 1, "timeout": 20_000})
        assert done.output == EVERY_LINE, done.output
        assert "made before the kill" in (await tk.call("read", {"path": "before.txt"})).output
        assert (await tk.call("write", {"path": "after.txt", "content": "x"})).is_error is False
        assert tk.settings.orphan_timeout_s == 60 and tk.settings.timeout_policy == "detach"
    finally:
        await tk.close()
    assert not _engine_has(handle)  # a normal close ends it at once
    # copy mode: made before the kill and after the attach, both home at the final close
    assert (workspace / "before.txt").read_text() == "made before the kill\n"
    assert (workspace / "after.txt").read_text() == "x"


@pytest.mark.parametrize("engine", BACKENDS + REMOTE)
async def test_orphan_timeout_ends_the_sandbox_and_leaves_nothing(
        engine: str, workspace: Path) -> None:
    tag = f"orphan-{uuid.uuid4().hex}"  # its own command: other workers run the same one
    client, handle = _client(engine, workspace, "long", 2, tag)
    _kill(client)
    assert _engine_has(handle)
    deadline = time.monotonic() + 20
    while _engine_has(handle) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not _engine_has(handle)  # no running container, no host agent socket
    if handle.workspace_mode == "copy":  # kept stopped for a copy-back; the next janitor's
        from toolseam.backends.containers.janitor import janitor
        engine_ = _engine(handle)
        try:
            janitor(engine_)
            assert _left_of(engine_, handle) == ([], [])
        finally:
            engine_.close()
    elif engine != "host":  # bind mode: the engine removes it (auto-remove), just after it stops
        from toolseam.backends.containers.engine.errors import EngineNotFound
        engine_ = _engine(handle)
        try:
            removed_by = time.monotonic() + 10
            with pytest.raises(EngineNotFound):
                while time.monotonic() < removed_by:
                    engine_.state(handle.sandbox)
                    await asyncio.sleep(0.1)
        finally:
            engine_.close()
    assert host_survivors(tag) == []  # the job's shell on the host (a container's: gone)
    if engine == "host":
        assert not os.path.exists(os.path.dirname(handle.socket))
    with pytest.raises(AttachError) as refused:
        await Toolkit.attach(handle, **attach_options(engine))  # type: ignore[arg-type]
    assert refused.value.reason in ("ended", "gone")


@pytest.mark.parametrize("engine", BACKENDS + REMOTE)
async def test_attach_refusals_kill_nothing(engine: str, workspace: Path) -> None:
    tk = _toolkit(engine, workspace)
    await tk.open()
    try:
        handle = tk.handle
        wrong = handle.model_copy(update={"secret": "x" * 43})
        with pytest.raises(AttachError) as refused:
            await Toolkit.attach(wrong, **attach_options(engine))  # type: ignore[arg-type]
        assert refused.value.reason == "wrong_secret"
        with pytest.raises(AttachError) as busy:  # a second attach while one is live
            await Toolkit.attach(handle, **attach_options(engine))  # type: ignore[arg-type]
        assert busy.value.reason == "in_use"
        assert (await tk.call("bash", {"command": "echo alive"})).output == "alive\n"
    finally:
        await tk.close()


@pytest.mark.parametrize("engine", BACKENDS + REMOTE)
async def test_detach_then_attach_keeps_jobs_files_settings_and_shell(
        engine: str, workspace: Path) -> None:
    tk = _toolkit(engine, workspace, default_timeout_ms=300)
    await tk.open()
    pinned = await tk.pin_shell()
    started = await tk.call("bash", {"command": "echo one; sleep 1.5; echo two", "keep": True})
    assert started.metadata["detached"] is True
    handle = await tk.detach()
    with pytest.raises(Exception, match="closed"):
        await tk.call("bash", {"command": "true"})
    again = await Toolkit.attach(handle, **attach_options(engine))  # type: ignore[arg-type]
    try:
        assert again.services._pinned == pinned
        assert again.settings == tk.settings
        done = await again.call("bash", {"wait": 1, "timeout": 10_000})
        assert done.output == "one\ntwo\n"
        handle_again = again.handle
        assert handle_again.sandbox == handle.sandbox
    finally:
        await again.close()


@pytest.mark.parametrize("engine", BACKENDS + REMOTE)
async def test_connection_dropped_mid_call_is_resumed(engine: str, workspace: Path) -> None:
    tk = _toolkit(engine, workspace)
    await tk.open()
    try:
        channel = tk.backend.durable_channel()  # type: ignore[attr-defined]
        call = asyncio.ensure_future(tk.call("bash", {"command": "sleep 0.8; echo finished"}))
        await asyncio.sleep(0.3)
        assert channel._transport is not None
        channel._transport.abort()  # the connection drops; the client and the agent live
        result = await call
        assert result.output == "finished\n"
        assert channel.reconnects == 1
        assert (await tk.call("bash", {"command": "echo next"})).output == "next\n"
    finally:
        await tk.close()


async def test_an_answer_the_agent_never_saw_is_reported_lost(tmp_path: Path) -> None:
    """A request that died with the connection before the agent read it is "lost", plainly."""
    tk = _toolkit("host", tmp_path)
    await tk.open()
    try:
        channel = tk.backend.durable_channel()  # type: ignore[attr-defined]
        assert isinstance(channel, DurableChannel)
        transport = channel._transport
        assert transport is not None
        transport.pause_reading()
        real_write = transport.write
        transport.write = lambda data: None  # type: ignore[method-assign]  # never sent
        call = asyncio.ensure_future(channel.call("hello"))
        await asyncio.sleep(0.05)
        transport.write = real_write  # type: ignore[method-assign]
        transport.abort()
        with pytest.raises(Exception, match="dropped before this answer") as lost:
            await call
        assert "effect is unknown" in str(lost.value)
    finally:
        await tk.close()


async def test_detach_is_refused_while_orphan_timeout_is_zero(tmp_path: Path) -> None:
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        with pytest.raises(ConfigurationError, match="orphan_timeout_s"):
            await tk.detach()
        with pytest.raises(ConfigurationError, match="orphan_timeout_s"):
            _ = tk.handle
        assert (await tk.call("bash", {"command": "echo still"})).output == "still\n"


def test_bad_handles_are_clear_errors() -> None:
    with pytest.raises(AttachError, match="not JSON"):
        SessionHandle.from_json("{")
    with pytest.raises(AttachError, match="secret"):
        SessionHandle.from_json('{"backend": "host", "socket": "/x", "sandbox": "1", '
                                '"workspace_mode": "host", "workspace": "/", "session_id": "s"}')
    with pytest.raises(AttachError, match="version 9"):
        SessionHandle.from_json('{"version": 9}')
    handle = SessionHandle(backend="host", socket="/x", sandbox="1", workspace_mode="host",
                           workspace="/", session_id="s", secret="s" * 43)
    assert "sss" not in repr(handle)
    assert SessionHandle.from_json(handle.to_json()) == handle


async def test_a_handle_whose_session_ended(tmp_path: Path) -> None:
    tk = _toolkit("host", tmp_path)
    await tk.open()
    handle = tk.handle
    await tk.close()
    with pytest.raises(AttachError) as ended:
        await Toolkit.attach(handle)
    assert ended.value.reason == "ended"


@given(st.builds(
    SessionHandle, backend=st.sampled_from(LOCAL_BACKENDS),
    endpoint=st.none() | st.text(max_size=40), socket=st.text(max_size=80),
    sandbox=st.text(max_size=64), workspace_mode=st.sampled_from(["host", "bind", "copy"]),
    workspace=st.text(max_size=80), image=st.none() | st.text(max_size=40),
    session_id=st.text(max_size=20), secret=st.text(min_size=16, max_size=60)))
def test_a_handle_survives_its_json(handle: SessionHandle) -> None:
    assert SessionHandle.from_json(handle.to_json()) == handle
    assert "secret=" not in repr(handle)


async def test_commands_never_see_the_secret_nor_inherit_its_hash(tmp_path: Path) -> None:
    tk = _toolkit("host", tmp_path)
    await tk.open()
    try:
        own = (await tk.call("bash", {"command": "env"})).output
        assert tk.handle.secret not in own and "TOOLSEAM_SESSION_SECRET" not in own
        agent = (await tk.call("bash", {"command": "tr '\\0' '\\n' < /proc/1/environ"})).output
        assert tk.handle.secret not in agent  # the agent holds only the hash
    finally:
        await tk.close()


def test_sync_toolkit_detaches_and_attaches(tmp_path: Path) -> None:
    tools = SyncToolkit("host", base_dir=str(tmp_path),
                        settings={"orphan_timeout_s": 30, "timeout_policy": "detach",
                                  "default_timeout_ms": 200})
    tools.open()
    assert tools.call("bash", {"command": "sleep 0.6; echo late"}).metadata["detached"]
    handle = tools.detach()
    again = SyncToolkit.attach(handle.to_json())
    try:
        assert again.call("bash", {"wait": 1, "timeout": 5000}).output == "late\n"
    finally:
        again.close()
    assert not os.path.exists(handle.socket)


async def test_a_host_agent_without_a_pid_namespace_outlives_its_client_too(
        tmp_path: Path) -> None:
    tk = Toolkit(HostBackend(str(tmp_path), pid_namespace=False,
                             lifetime=Durable(orphan_timeout_s=30)))
    await tk.open()
    assert tk.info is not None and tk.info.pid_namespace is False
    handle = await tk.detach()
    again = await Toolkit.attach(handle)
    try:
        assert (await again.call("bash", {"command": "echo here"})).output == "here\n"
    finally:
        await again.close()
    assert not os.path.exists(handle.socket)


async def test_an_attach_that_fails_at_open_leaves_the_session_running(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    tk = _toolkit("host", base)
    await tk.open()
    directory = Path(tk.handle.socket).parent
    assert directory.stat().st_mode & 0o777 == 0o700  # the socket's directory: this user's
    assert Path(tk.handle.socket).stat().st_mode & 0o777 == 0o600
    handle = await tk.detach()
    base.rename(tmp_path / "moved")
    with pytest.raises(ConfigurationError, match="does not exist"):
        await Toolkit.attach(handle)
    (tmp_path / "moved").rename(base)
    again = await Toolkit.attach(handle)  # nothing was ended by the failed attach
    try:
        assert (await again.call("bash", {"command": "echo on"})).output == "on\n"
    finally:
        await again.close()


async def test_idle_connections_cannot_crowd_out_an_attach(tmp_path: Path) -> None:
    """Connections that never attach (a command holding them open) are bounded: the oldest
    goes, and a real attach still gets in."""
    import socket as sockets
    tk = _toolkit("host", tmp_path)
    await tk.open()
    idle = []
    try:
        handle = await tk.detach()
        for _ in range(100):
            conn = sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM)
            conn.connect(handle.socket)
            idle.append(conn)
        again = await Toolkit.attach(handle)
        try:
            assert (await again.call("bash", {"command": "echo in"})).output == "in\n"
            open_fds = (await again.call("bash", {"command": "ls /proc/1/fd | wc -l"})).output
            assert int(open_fds) < 60
        finally:
            await again.close()
    finally:
        for conn in idle:
            conn.close()


@pytest.mark.parametrize("engine", REMOTE)
async def test_another_sessions_janitor_spares_a_closing_copy(engine: str, workspace: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """A durable copy-mode container has no owner (any client may attach): stopped by its
    closing client for the copy-back, it looked to another session's janitor like one that had
    ended by itself, and went — with the work — under the copy-back (seen with two workers on
    one engine). That janitor runs here in exactly that window."""
    from toolseam.backends.containers.janitor import janitor
    from toolseam.backends.containers.modes.copy import CopyMode

    tk = _toolkit(engine, workspace)
    await tk.open()
    await tk.call("write", {"path": "made-inside.txt", "content": "comes home\n"})
    finish = CopyMode.finish

    async def finish_after_a_janitor(self: CopyMode, sandbox: Any) -> None:
        engine_ = _engine(tk.handle)
        try:
            await asyncio.to_thread(janitor, engine_)  # another session's, on the same engine
        finally:
            engine_.close()
        await finish(self, sandbox)

    monkeypatch.setattr(CopyMode, "finish", finish_after_a_janitor)
    await tk.close()  # raised CouldNotRunError before: "no such container"
    assert (workspace / "made-inside.txt").read_text() == "comes home\n"
    engine_ = _engine(tk.handle)
    try:  # and nothing is left: no container, no workspace volume, no closing marker
        assert _left_of(engine_, tk.handle) == ([], [])
    finally:
        engine_.close()


async def test_a_job_that_ends_while_no_client_is_attached_is_kept_for_the_next(
        tmp_path: Path) -> None:
    """A call in flight when its client detached, whose command ends before anyone attaches:
    the agent keeps the job (its start asked to be forgotten, but the client that asked is
    gone), so the attaching client takes it over, reads how it ended and closes cleanly. Before
    the fix the agent forgot it at its end: the attach found no job, or (had the attach come
    first) the close's kill raised ``no job`` — issue 45's two durable flakes. Both orders fail
    without the fix and pass with it; the command waits for a file the test makes."""
    tk = _toolkit("host", tmp_path)
    await tk.open()
    tag = f"ends-alone-{uuid.uuid4().hex}"
    command = f": {tag}; echo begun; while [ ! -e go ]; do sleep 0.02; done; echo ended"
    call = asyncio.ensure_future(tk.call("bash", {"command": command}))
    await _until(lambda: call.done() or bool(host_survivors(tag)))
    assert not call.done(), call.result()
    handle = await tk.detach()
    await asyncio.gather(call, return_exceptions=True)  # fails with the channel
    (tmp_path / "go").touch()
    await _until(lambda: not host_survivors(tag))  # ended, with no client there to be told
    again = await Toolkit.attach(handle, **attach_options("host"))  # type: ignore[arg-type]
    try:
        assert again.adopted_jobs == [1]  # before the fix: [] (the agent had forgotten it)
        done = await again.call("bash", {"wait": 1, "timeout": 10_000})
        assert done.output == "begun\nended\n"
        listed = await again.call("bash", {"jobs": True})
        assert [(j["id"], j["state"]) for j in listed.metadata["jobs"]] == [(1, "exited")]
    finally:
        await again.close()  # before the fix, in the other order: UnknownJobError
    assert not _engine_has(handle)


async def _until(condition: Callable[[], bool], limit_s: float = 60) -> None:
    """Wait for ``condition``; the limit only stops a hang."""
    deadline = time.monotonic() + patience(limit_s)
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.02)
