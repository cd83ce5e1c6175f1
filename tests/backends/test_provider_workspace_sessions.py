"""``ToolseamWorkspace``'s own promises beyond pydantic-ai's suite: no I/O when built, one
environment under concurrent first use, a ref without the secret, attach from another process
to a detached process, attach after the end raising unavailable, and nothing left behind."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest
from pydantic_ai.workspaces import Workspace, WorkspaceRef, WorkspaceUnavailableError

from toolseam import ConfigurationError
from toolseam.integrations.pydantic_ai import ToolseamWorkspace

from ..support.engines import remove_shared, shared_dir
from ..support.processes import host_started, host_survivors
from ..support.providers import provider_options
from ..support.timing import patience


def test_building_does_no_io_and_a_bad_ref_is_unavailable(tmp_path: Path) -> None:
    threads = threading.active_count()
    made = ToolseamWorkspace("podman", image="no-such-image",
                             backend_options={"endpoint": "unix:///nonexistent.sock"},
                             secret_store=tmp_path)
    attached = ToolseamWorkspace.attach(WorkspaceRef(provider="toolseam", id="../../etc/passwd"),
                                        secret_store=tmp_path)
    assert made.ref is None and threading.active_count() == threads
    assert attached.ref == WorkspaceRef(provider="toolseam", id="../../etc/passwd")
    with pytest.raises(WorkspaceUnavailableError):
        asyncio.run(attached.working_dir())
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="not a toolseam"):
        ToolseamWorkspace.attach(WorkspaceRef(provider="local", id="/tmp"))
    with pytest.raises(ConfigurationError, match="backend must be"):
        ToolseamWorkspace("vm")
    with pytest.raises(ConfigurationError, match="image is for a container"):
        ToolseamWorkspace("host", image="alpine")
    assert threading.active_count() == threads


async def test_concurrent_first_use_opens_one_environment_and_keeps_no_secret_in_the_ref(
        tmp_path: Path) -> None:
    store = tmp_path / "store"
    workspace = ToolseamWorkspace("host", secret_store=store)
    try:
        dirs = await asyncio.gather(*(workspace.working_dir() for _ in range(8)))
        assert len(set(dirs)) == 1 and workspace.ref is not None
        kept = list(store.iterdir())
        assert len(kept) == 1  # one environment, one secret
        assert stat.S_IMODE(store.stat().st_mode) == 0o700
        assert stat.S_IMODE(kept[0].stat().st_mode) == 0o600
        secret = json.loads(kept[0].read_text())["secret"]
        assert len(secret) >= 16 and secret not in workspace.ref.id
        assert json.loads(workspace.ref.id)["session_id"]
    finally:
        await workspace.destroy()
    assert list(store.iterdir()) == []


_ATTACHER = textwrap.dedent("""
    import asyncio, json, sys
    from pydantic_ai.workspaces import Workspace, WorkspaceRef
    from toolseam.integrations.pydantic_ai import ToolseamWorkspace

    async def main():
        ref = WorkspaceRef(**json.loads(sys.argv[1]))
        backend = ToolseamWorkspace.attach(ref, secret_store=sys.argv[2])
        workspace = Workspace(backend)
        await workspace.write_bytes(sys.argv[3] + "/release", b"go")
        for _ in range(300):
            if await workspace.exists(sys.argv[3] + "/finished"):
                break
            await asyncio.sleep(0.1)
        print((await workspace.read_bytes(sys.argv[3] + "/finished")).decode())
        await backend.destroy()

    asyncio.run(main())
""")


@pytest.mark.parametrize("engine", ["host", "podman-rootless"])
def test_another_process_attaches_to_a_detached_process_then_destroys(
        engine: str, tmp_path: Path) -> None:
    name, options, made = provider_options(engine)
    store = tmp_path / "store"
    marker = f"detached-{uuid.uuid4().hex[:8]}"
    backend = ToolseamWorkspace(name, secret_store=store, **options)

    async def start() -> tuple[WorkspaceRef, str]:
        root = await backend.working_dir()
        launch = (f'setsid sh -c \'while [ ! -f "$1/release" ]; do sleep 0.1; done; '
                  f'echo {marker} > "$1/finished"\' sh "$1" </dev/null >/dev/null 2>&1 &')
        result = await backend.run(["sh", "-c", launch, "sh", root])
        assert result.exit_code == 0
        assert backend.ref is not None
        await backend.close()  # this process lets go; the environment goes on
        return backend.ref, root

    try:
        ref, root = asyncio.run(start())
        done = subprocess.run([sys.executable, "-c", _ATTACHER, json.dumps(
            {"provider": ref.provider, "id": ref.id}), str(store), root],
            capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == marker
        if engine == "host":  # the directory the creator made went with the environment
            assert not os.path.exists(root)
        with pytest.raises(WorkspaceUnavailableError):  # destroyed by the other process
            asyncio.run(ToolseamWorkspace.attach(ref, secret_store=store).working_dir())
    finally:
        if made is not None:
            remove_shared(made)


def test_an_environment_past_its_orphan_timeout_is_unavailable(tmp_path: Path) -> None:
    # its own workspace: a directory the provider made is removed by destroy, and nobody
    # destroys an environment that ended by itself
    store, work = tmp_path / "store", tmp_path / "work"
    work.mkdir()
    backend = ToolseamWorkspace("host", secret_store=store, workspace=str(work),
                                settings={"orphan_timeout_s": 1})

    async def open_and_leave() -> WorkspaceRef:
        await backend.working_dir()
        assert backend.ref is not None
        await backend.close()
        return backend.ref

    ref = asyncio.run(open_and_leave())
    time.sleep(3)
    with pytest.raises(WorkspaceUnavailableError, match="gone"):
        asyncio.run(ToolseamWorkspace.attach(ref, secret_store=store).working_dir())


async def test_destroy_ends_what_commands_left_running_and_the_workspace(tmp_path: Path
                                                                          ) -> None:
    """Background and setsid processes outlive their command (the contract) but not the
    environment: nothing of them is left on this machine after destroy."""
    backend = ToolseamWorkspace("host", secret_store=tmp_path)
    workspace = Workspace(backend)
    marker = uuid.uuid4().hex[:10]
    await workspace.run(f"sh -c 'sleep 300; : {marker}-bg' >/dev/null 2>&1 &", shell=True)
    await workspace.run(f"setsid sh -c 'sleep 300; : {marker}-sid' </dev/null >/dev/null 2>&1 &",
                        shell=True)
    # both are running: each kind once at least (``sh -c`` forking its ``sleep`` shows twice
    # for a moment under load — the fork before its exec has the same command line)
    deadline = time.monotonic() + patience(10)
    while {line.rsplit("-", 1)[-1] for line in host_started(marker)} != {"bg", "sid"}:
        assert time.monotonic() < deadline, host_survivors(marker)
        await asyncio.sleep(0.05)
    root = await workspace.working_dir()
    await backend.destroy()
    deadline = time.monotonic() + 10
    while host_survivors(marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert host_survivors(marker) == []
    assert not os.path.exists(root)


async def test_a_command_past_its_timeout_is_killed_whole(tmp_path: Path) -> None:
    """keep_detached spares only what left the command's session: its own children die."""
    backend = ToolseamWorkspace("host", secret_store=tmp_path)
    marker = uuid.uuid4().hex[:10]
    try:
        with pytest.raises(TimeoutError):
            await backend.run(["sh", "-c", f"sh -c 'sleep 300; : {marker}' & wait"],
                              timeout=0.5)
        deadline = time.monotonic() + 10
        while host_survivors(marker) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert host_survivors(marker) == []
    finally:
        await backend.destroy()


async def test_a_caller_cancelled_mid_create_keeps_the_environment(tmp_path: Path) -> None:
    backend = ToolseamWorkspace("host", secret_store=tmp_path)
    first = asyncio.ensure_future(backend.working_dir())
    await asyncio.sleep(0.01)  # the open has started on the backend's loop
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    try:
        root = await backend.working_dir()  # the same environment, once it is open
        assert backend.ref is not None and len(list(tmp_path.iterdir())) == 1
        assert os.path.isdir(root)
    finally:
        await backend.destroy()


@pytest.mark.engines  # needs an engine without naming it in a parameter
def test_a_container_sandbox_cannot_read_the_attach_secret(tmp_path: Path) -> None:
    """The secret stays on this machine's side: not in the container's files, environment or
    the ref — a command in the sandbox has nothing to attach with."""
    store = Path(shared_dir())  # where the rootless engine's user could reach it, were it bound
    name, options, made = provider_options("podman-rootless")
    backend = ToolseamWorkspace(name, secret_store=store, **options)

    async def probe() -> None:
        try:
            await backend.working_dir()
            (kept,) = list(store.iterdir())
            secret = json.loads(kept.read_text())["secret"]
            found = await backend.run(["sh", "-c", 'cat "$1" 2>&1; env; cat /proc/1/environ',
                                       "sh", str(kept)])
            assert secret not in found.stdout + found.stderr
            assert "No such file" in found.stdout
        finally:
            await backend.destroy()

    try:
        asyncio.run(probe())
    finally:
        remove_shared(store)
        if made is not None:
            remove_shared(made)
