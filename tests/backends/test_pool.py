"""``SandboxPool`` on the real engines: one sandbox per session, never shared, never reused;
nothing left after a crash (the janitor); an image that cannot start is could-not-run at
hand-out, not a hang. The contract suite on pooled sessions is ``test_pool_contract.py``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam import (
    ConfigurationError,
    CouldNotRunError,
    HostError,
    SandboxLimits,
    SandboxPool,
    SessionClosedError,
    Toolkit,
)
from toolseam.backends import staging
from toolseam.backends.containers import sandbox
from toolseam.backends.containers.bundle import staged as bundle
from toolseam.backends.containers.engine.sdk import SdkEngine
from toolseam.backends.containers.janitor import janitor
from toolseam.backends.containers.labels import POOL_LABEL
from toolseam.backends.containers.pool import mounts as pool_mounts
from toolseam.backends.containers.pool import warm as pool_module

from ..support.contract_bindings import pool_factory
from ..support.engines import ENGINES, REMOTE_ENGINES, backend, endpoint, remove_shared, shared_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def workspaces() -> Any:
    made: list[Path] = []

    def make(files: dict[str, str] | None = None) -> Path:
        path = shared_dir()
        for name, text in (files or {}).items():
            (path / name).write_text(text)
        made.append(path)
        return path
    yield make
    for path in made:
        remove_shared(path)


def _engine(engine: str, where: Path) -> Any:
    return backend(engine, str(where)).sandbox.engine  # type: ignore[attr-defined]


def _pool_containers(engine: str, where: Path, pool_id: str) -> list[str]:
    return [c for c, labels in _engine(engine, where).labeled(POOL_LABEL)
            if labels.get(POOL_LABEL) == pool_id]


def _mounts_below(path: str) -> list[str]:
    """Mounts below ``path`` here and in rootless podman's mount namespace."""
    found = []
    rootless = pool_module.rootless_namespace(endpoint("podman-rootless").removeprefix("unix://"))
    for pid in ("self", *([str(rootless)] if rootless else [])):
        with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as info:
            found += [line.split()[4] for line in info if line.split()[4].startswith(path)]
    return found


@pytest.mark.parametrize("engine", [*ENGINES, *REMOTE_ENGINES])
async def test_sessions_never_share_a_sandbox_and_none_is_reused(engine: str, workspaces: Any
                                                                  ) -> None:
    """Three sessions from a pool of two: three containers, each seeing only its own base
    dir and its own /tmp; a closed session's container is gone and never handed out again."""
    dirs = [workspaces({f"only-{i}.txt": f"{i}\n"}) for i in range(3)]
    async with SandboxPool(pool_factory(engine), size=2) as pool:
        await pool.wait_full()
        toolkits: list[Toolkit] = await asyncio.gather(*(pool.toolkit(d) for d in dirs))
        containers = [tk.backend.sandbox.container for tk in toolkits]  # type: ignore[attr-defined]
        assert len(set(containers)) == 3
        for i, tk in enumerate(toolkits):
            listed = await tk.call("bash", {"command": "ls; echo mine > /tmp/mark; hostname"})
            assert listed.output.split() == [f"only-{i}.txt", containers[i][:12]], listed.output
            wrote = await tk.call("write", {"path": "from-sandbox.txt", "content": f"s{i}\n"})
            assert not wrote.is_error, wrote.output
        for tk in toolkits[1:]:
            # written by the first session's commands: not in any other sandbox's /tmp yet
            seen = await tk.call("bash", {"command": "cat /tmp/mark"})
            assert seen.output == "mine\n"
        await toolkits[0].close()
        assert containers[0] not in _pool_containers(engine, dirs[0], pool.pool_id)
        later = await pool.toolkit(dirs[0])
        assert later.backend.sandbox.container not in containers  # type: ignore[attr-defined]
        assert (await later.call("bash", {"command": "ls /tmp"})).output == ""
        await later.close()
        for tk in toolkits[1:]:
            await tk.close()
    for i, d in enumerate(dirs):
        assert (d / "from-sandbox.txt").read_text() == f"s{i}\n"  # copy mode brings it home
    assert _pool_containers(engine, dirs[0], pool.pool_id) == []


@pytest.mark.parametrize("engine", ENGINES)
async def test_leaving_the_pool_removes_every_sandbox_it_made(engine: str, workspaces: Any
                                                              ) -> None:
    work = workspaces()
    async with SandboxPool(pool_factory(engine), size=2) as pool:
        await pool.wait_full()
        tk = await pool.toolkit(work)
        assert (await tk.call("bash", {"command": "true"})).metadata["exitCode"] == 0
        await pool.wait_full()
        assert len(_pool_containers(engine, work, pool.pool_id)) == 3  # handed + two warm
        await pool.toolkit(work)  # and leave while its replacement is starting
        directory = pool.host_dir
    assert directory is not None and not os.path.exists(directory)
    assert _mounts_below(directory) == []
    assert _pool_containers(engine, work, pool.pool_id) == []
    with pytest.raises(SessionClosedError):  # its sandbox went with the pool
        await tk.call("bash", {"command": "true"})
    await tk.close()


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_copy_mode_hand_out_of_an_empty_base_dir_sends_the_engine_nothing(
        engine: str, workspaces: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty base dir packs no entry: its hand-out makes no engine call (32 of them at once
    were a Ray pool claim's whole 1.6-2.9 s, decision 311), and what the session writes still
    comes home at close; a base dir with a file is copied in as before."""
    sent: list[str] = []
    real = SdkEngine.put_archive

    def counted(self: SdkEngine, container: str, path: str, data: Any) -> None:
        sent.append(path)
        real(self, container, path, data)
    monkeypatch.setattr(SdkEngine, "put_archive", counted)
    empty, full = workspaces(), workspaces({"in.txt": "given\n"})
    async with SandboxPool(pool_factory(engine), size=2, workspace_mode="copy") as pool:
        await pool.wait_full()
        before = list(sent)  # the agent volume's fill, on an engine that had none yet
        tk = await pool.toolkit(empty)
        assert sent == before
        made = await tk.call("bash", {"command": "ls -A; echo made > out.txt"})
        assert made.output == ""
        await tk.close()
        assert (empty / "out.txt").read_text() == "made\n"
        tk = await pool.toolkit(full)
        assert sent == [*before, "/workspace"]
        assert (await tk.call("bash", {"command": "cat in.txt"})).output == "given\n"
        await tk.close()


_CRASHING = textwrap.dedent("""
    import asyncio, functools, json, sys
    from toolseam import SandboxPool
    from tests.support.engines import backend

    async def main():
        pool = await SandboxPool(functools.partial(backend, sys.argv[1]), size=2).start()
        await pool.wait_full()
        print(json.dumps({"pool": pool.pool_id, "dir": pool.host_dir,
                          "containers": pool.warm_containers}), flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


@pytest.fixture
def own_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An ``XDG_CACHE_HOME`` of this test's own, so a staging root no other process sweeps;
    below /tmp, where a rootless engine's user passes through (pytest's tmp_path is 0700)."""
    cache = Path(tempfile.mkdtemp(prefix="toolseam-test-cache-"))
    cache.chmod(0o711)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    yield cache
    shutil.rmtree(cache, ignore_errors=True)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_pool_killed_with_sigkill_leaves_nothing_after_the_janitor(
        engine: str, workspaces: Any, own_cache: Path) -> None:
    # every session's start runs the janitor, in the suite's other worker too: the pool's
    # directory lives in a staging root of this test's own (XDG_CACHE_HOME), which no other
    # janitor sweeps, so it is still there after the kill; its containers are counted while
    # their owner lives, when no janitor may take them (stop 54's CI: another worker's swept
    # the directory between the kill and the count)
    work = workspaces()
    with subprocess.Popen([sys.executable, "-c", _CRASHING, engine], cwd=ROOT,
                          stdout=subprocess.PIPE, text=True) as process:
        try:
            assert process.stdout is not None
            made = json.loads(process.stdout.readline())
            assert len(made["containers"]) == 2
            assert (sorted(_pool_containers(engine, work, made["pool"]))
                    == sorted(made["containers"]))
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
    assert made["dir"].startswith(str(own_cache))
    assert os.path.isdir(made["dir"])  # a SIGKILL leaves it
    janitor(_engine(engine, work))  # what every session's start runs
    assert _pool_containers(engine, work, made["pool"]) == []
    assert not os.path.exists(made["dir"])
    assert _mounts_below(made["dir"]) == []


@pytest.mark.parametrize("engine", ENGINES)
async def test_an_image_that_cannot_start_is_could_not_run_at_hand_out(engine: str,
                                                                       workspaces: Any) -> None:
    work = workspaces()
    image = "localhost/toolseam-no-such-image:never"
    async with SandboxPool(pool_factory(engine), size=2, image=image, pull="never") as pool:
        for _ in range(2):  # each hand-out tries once more, then says why: never a hang
            with pytest.raises(CouldNotRunError) as failed:
                await asyncio.wait_for(pool.toolkit(work), 60)
            assert image in failed.value.reason and not failed.value.retryable
        deadline = time.monotonic() + 60
        while pool.starting and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        # every start failed and none is in flight: wait_full waited for a change that never
        # came (a 60 s timeout in the suite); like a hand-out it tries again, and says why
        with pytest.raises(CouldNotRunError):
            await asyncio.wait_for(pool.wait_full(), 60)
        assert _pool_containers(engine, work, pool.pool_id) == []


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_host_mistakes_are_configuration_errors_before_any_sandbox_is_taken(
        workspaces: Any) -> None:
    with pytest.raises(ConfigurationError, match="size"):
        SandboxPool(pool_factory("docker"), size=0)
    with pytest.raises(ConfigurationError, match="refill_concurrency"):
        SandboxPool(pool_factory("docker"), refill_concurrency=0)
    pool = SandboxPool(pool_factory("docker"), size=1, limits=SandboxLimits(memory="256m"))
    try:
        with pytest.raises(ConfigurationError, match="limits"):
            await pool.toolkit(workspaces(), settings={"limits": {"memory": "128m"}})
        with pytest.raises(ConfigurationError, match="does not exist"):
            await pool.toolkit("/nonexistent/toolseam-base")
        assert pool.handed_count == 0
    finally:
        await pool.close()


@pytest.mark.engines  # needs an engine without naming it in a parameter
def test_every_engine_pools_by_mount_here_and_copies_where_it_cannot_mount(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The mode rule (decisions 110, 114) as this root test process meets it."""
    for engine in ENGINES:
        assert SandboxPool(pool_factory(engine)).mode == "bind"
        assert SandboxPool(pool_factory(engine), workspace_mode="copy").mode == "copy"
    # rootless podman whose namespace cannot be found (or a process that may not mount): copy
    monkeypatch.setattr(pool_module, "rootless_namespace", lambda socket: None)
    assert SandboxPool(pool_factory("podman-rootless")).mode == "copy"
    with pytest.raises(ConfigurationError, match="mount namespace"):
        SandboxPool(pool_factory("podman-rootless"), workspace_mode="bind")
    monkeypatch.setattr(pool_module, "can_mount", lambda: False)
    assert SandboxPool(pool_factory("docker")).mode == "copy"


def test_concurrent_first_stagings_verify_the_bundle_once(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """16 sessions opening at once each hashed the 78 MB bundle (3.2 s -> 14 s for a burst)."""
    bundle.stage_bundle()
    hashed: list[Path] = []
    real = staging._sha256

    def counting(path: Path) -> str:
        hashed.append(path)
        return real(path)
    monkeypatch.setattr(staging, "_sha256", counting)
    monkeypatch.setattr(staging, "_verified", {})
    bundle.stage_bundle()
    once = len(hashed)
    assert once > 100
    hashed.clear()
    monkeypatch.setattr(staging, "_verified", {})
    with concurrent.futures.ThreadPoolExecutor(4) as threads:
        staged = set(threads.map(lambda _: bundle.stage_bundle(), range(4)))
    assert len(staged) == 1 and len(hashed) == once


@pytest.mark.parametrize("engine", ["podman", "docker"])
async def test_concurrent_opens_ask_the_engine_its_arch_once(engine: str, workspaces: Any,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Podman's ``info`` took 2.6 s each with 16 sessions asking at once."""
    asked: list[float] = []
    real = SdkEngine.arch

    def counting(self: SdkEngine) -> str:
        asked.append(time.monotonic())
        time.sleep(0.2)  # slow, as under load: the others must wait, not ask too
        return real(self)
    monkeypatch.setattr(SdkEngine, "arch", counting)
    monkeypatch.setattr(sandbox, "_ENGINE_ARCH", {})
    work = workspaces()
    toolkits = [Toolkit(backend(engine, str(work))) for _ in range(4)]
    try:
        await asyncio.gather(*(tk.open() for tk in toolkits))
    finally:
        await asyncio.gather(*(tk.close() for tk in toolkits))
    assert len(asked) == 1


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_root_runs_nothing_from_rootless_podmans_namespace(workspaces: Any) -> None:
    """That namespace's mounts are its unprivileged owner's: had the pool run ``nsenter …
    mount`` in it, the owner's own ``mount`` (bound over /usr/bin/mount there) would have run
    as root. The pool's mounts are libc calls from a forked child instead."""
    pid = pool_module.rootless_namespace(endpoint("podman-rootless").removeprefix("unix://"))
    assert pid is not None
    work = workspaces({"here.txt": "yes\n"})
    fake, marker = work.parent / f"{work.name}-mount", work.parent / f"{work.name}-ran-as-root"
    # The namespace's owner runs mount there too (podman mounts a fork's overlay volume with
    # it, for a test on the other worker): its own runs go on to the real mount; only one by
    # root of the machine's first user namespace, the attack, is marked.
    real = work.parent / f"{work.name}-real-mount"
    shutil.copyfile("/usr/bin/mount", real)  # its bytes, never its set-uid bit
    real.chmod(0o755)
    fake.write_text("#!/bin/sh\nif grep -Eq '^ +0 +0 +4294967295$' /proc/self/uid_map; then "
                    f"id -u > {marker}; exit 1; fi\nexec {real} \"$@\"\n")
    fake.chmod(0o755)
    enter = ["nsenter", "-t", str(pid), "-m", "--"]
    subprocess.run([*enter, "/usr/bin/umount", "--version"], check=True, capture_output=True)
    subprocess.run([*enter, "/usr/bin/umount", "-l", "/usr/bin/mount"], capture_output=True,
                   check=False)  # a leftover of an interrupted run
    # what the namespace's owner may do: its namespace, its mounts (root stands in for it)
    subprocess.run([*enter, "/usr/bin/mount", "--bind", str(fake), "/usr/bin/mount"], check=True)
    try:
        async with SandboxPool(pool_factory("podman-rootless"), size=1, refill=False) as pool:
            tk = await pool.toolkit(work)
            assert (await tk.call("bash", {"command": "cat here.txt"})).output == "yes\n"
            await tk.close()
    finally:
        subprocess.run([*enter, "/usr/bin/umount", "-l", "/usr/bin/mount"], check=True)
        fake.unlink()
        real.unlink()
    assert not marker.exists()


@given(name=st.text(st.sampled_from(" \t\n\\ab\u00e9-"), min_size=1, max_size=12))
@settings(max_examples=40, deadline=None)
def test_the_mounts_below_a_path_are_found_whatever_its_name(name: str) -> None:
    """The pool finds its mounts in the kernel's mountinfo, which escapes space, tab, newline
    and backslash: every name comes back as the path that was mounted."""
    with tempfile.TemporaryDirectory(prefix="toolseam-mountinfo-") as top:
        target = os.path.join(top, name)
        os.mkdir(target)
        pool_mounts.HOST_SLOTS.share(target)
        try:
            assert pool_mounts._mounts_below(top, "/proc/self/mountinfo") == [target]
        finally:
            pool_mounts.HOST_SLOTS.unmount_below(top)
        assert pool_mounts._mounts_below(top, "/proc/self/mountinfo") == []


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_a_mount_that_does_not_reach_the_container_fails_closed(workspaces: Any) -> None:
    """Mounted on the host, not in rootless podman's namespace: the container still sees the
    empty slot, so the hand-out refuses instead of giving a session an empty workspace."""
    work = workspaces({"here.txt": "yes\n"})
    async with SandboxPool(pool_factory("podman-rootless"), size=1, refill=False) as pool:
        pool._mounts = pool_mounts.HOST_SLOTS  # the wrong namespace, on purpose
        with pytest.raises(CouldNotRunError, match="did not reach"):
            await pool.toolkit(work)
        assert _pool_containers("podman-rootless", work, pool.pool_id) == []
        directory = pool.host_dir
    assert directory is not None and _mounts_below(directory) == []


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_closing_the_pool_ends_the_hand_outs_waiting(workspaces: Any) -> None:
    """A hand-out waiting for a sandbox that will never come (the pool closed) is told so."""
    made = 0

    def factory(workspace: str, **options: Any) -> Any:
        """The probe and the first sandbox start; every later start hangs until cancelled
        (so the hand-out below surely waits: a real start can be quicker than the test)."""
        nonlocal made
        made += 1
        chosen = pool_factory("docker")(workspace, **options)
        if made > 2:
            async def never() -> Any:
                await asyncio.Event().wait()
            chosen.open = never
        return chosen

    pool = await SandboxPool(factory, size=1).start()
    first = await pool.backend(workspaces())  # the pool is empty now; its refill never ends
    waiting = asyncio.ensure_future(pool.backend(workspaces()))
    filling = asyncio.ensure_future(pool.wait_full())
    await asyncio.sleep(0.05)
    await pool.close()
    for task in (waiting, filling):
        with pytest.raises(HostError, match="closed"):
            await asyncio.wait_for(task, 30)
    assert first.closed


def test_a_bare_install_imports_toolseam_and_names_the_pools_extra() -> None:
    code = textwrap.dedent("""
        import sys
        for sdk in ("podman", "docker", "requests"):
            sys.modules[sdk] = None  # as if no container extra were installed
        import toolseam
        try:
            from toolseam import SandboxPool
        except toolseam.BackendUnavailable as exc:
            print(exc)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT)
    assert "SandboxPool needs the 'requests' package: pip install" in done.stdout, done.stderr
