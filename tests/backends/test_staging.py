"""The staged agent and runtime (issue 18 point 10): what runs as pid 1 in this user's
containers can be chosen by nobody else. Every test stages under a private stand-in for the
shared temp dir (sticky and world-writable, like /tmp), never the real one."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from toolseam import Toolkit
from toolseam.backends import staging
from toolseam.backends.agentlink.launch import AGENT_PACKAGE, AGENT_SOURCE
from toolseam.backends.containers.bundle.staged import stage_bundle

from ..support import engines

NOBODY = 65534
PLANT = '\nopen("/workspace/PLANTED", "w").close()  # a line another user added\n'


@pytest.fixture
def shared_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory like /tmp (1777) that engines can reach, as this process's temp dir."""
    if os.geteuid() != 0:
        pytest.skip("plants files as another user")
    genuine = Path(stage_bundle())  # built once, in the real staging root, to copy from
    tmp = engines.shared_dir()
    tmp.chmod(0o1777)
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    monkeypatch.setattr(staging, "_verified", {})
    monkeypatch.setattr(staging, "_private", [])
    monkeypatch.setattr("toolseam.backends.staging._candidates",
                        lambda uid: [tmp / f"toolseam-{uid}"])  # not the real ~/.cache
    monkeypatch.setenv("TOOLSEAM_TEST_GENUINE_BUNDLE", str(genuine))
    yield tmp
    engines.remove_shared(tmp)


def _plant(genuine: Path, target: Path) -> None:
    """A copy of a genuine bundle with one line added to the agent, owned by nobody."""
    shutil.copytree(genuine, target)
    shutil.rmtree(target / AGENT_PACKAGE / "__pycache__", ignore_errors=True)
    with open(target / AGENT_PACKAGE / "server.py", "a", encoding="utf-8") as server:
        server.write(PLANT)
    for path in [target, *target.rglob("*")]:
        os.lchown(path, NOBODY, NOBODY)


def _old_names() -> tuple[str, str]:
    """The names the shared temp dir used to hold: computable by anyone from the package."""
    sources = sorted(AGENT_SOURCE.glob("*.py"))
    agent = "toolseam-agent-" + hashlib.sha256(
        b"".join(p.name.encode() + p.read_bytes() for p in sources)).hexdigest()[:16]
    key = f"2:{os.path.realpath(sys.executable)}:{sys.version}:{agent}"
    return agent, "toolseam-bundle-" + hashlib.sha256(key.encode()).hexdigest()[:16]


async def _session_plants(engine: str) -> bool:
    """Open a bind-mode session and say whether the planted agent ran in it."""
    workspace = engines.shared_dir()
    try:
        async with Toolkit(engines.backend(engine, str(workspace), workspace_mode="bind")) as tk:
            result = await tk.call("bash", {"command": "echo alive"})
            assert result.output == "alive\n", result.output
        return (workspace / "PLANTED").exists()
    finally:
        engines.remove_shared(workspace)


@pytest.mark.parametrize("engine", ["podman", "docker"])
async def test_a_bundle_planted_at_the_old_shared_name_never_runs(shared_tmp: Path,
                                                                  engine: str) -> None:
    agent, bundle = _old_names()
    genuine = Path(os.environ["TOOLSEAM_TEST_GENUINE_BUNDLE"])
    _plant(genuine, shared_tmp / bundle)
    shutil.copytree(genuine / AGENT_PACKAGE, shared_tmp / agent / AGENT_PACKAGE)
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(shared_tmp / agent)], check=True)
    assert not await _session_plants(engine)
    staged = Path(stage_bundle())
    assert staged.parent == shared_tmp / f"toolseam-{os.geteuid()}"
    assert PLANT not in (staged / AGENT_PACKAGE / "server.py").read_text()


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_a_staging_root_another_user_made_is_never_used(shared_tmp: Path) -> None:
    squatted = shared_tmp / f"toolseam-{os.geteuid()}"
    squatted.mkdir()
    os.chown(squatted, NOBODY, NOBODY)
    genuine = Path(os.environ["TOOLSEAM_TEST_GENUINE_BUNDLE"])
    _plant(genuine, squatted / genuine.name)  # the very name this code looks for
    agent = next(genuine.parent.glob("agent-*"))
    shutil.copytree(agent, squatted / agent.name)
    assert not await _session_plants("podman")
    staged = Path(stage_bundle())
    assert squatted not in staged.parents
    root = staged.parent
    assert root.stat().st_uid == os.geteuid() and stat.S_IMODE(root.stat().st_mode) == 0o711


def _edit(bundle: Path) -> None:
    with open(bundle / AGENT_PACKAGE / "server.py", "a", encoding="utf-8") as server:
        server.write(PLANT)


def _give_away(bundle: Path) -> None:
    os.chown(bundle / "rt" / "ready", NOBODY, NOBODY)


def _group_writable(bundle: Path) -> None:
    (bundle / AGENT_PACKAGE).chmod(0o775)


def _symlink(bundle: Path) -> None:
    (bundle / AGENT_PACKAGE / "extra.py").symlink_to("/etc/hostname")


def _drop(bundle: Path) -> None:
    (bundle / "rt" / "bin" / "python3").unlink()


@pytest.mark.parametrize("tamper", [_edit, _give_away, _group_writable, _symlink, _drop])
def test_a_staged_bundle_is_reused_only_as_sealed(shared_tmp: Path,
                                                  tamper: Callable[[Path], None]) -> None:
    first = Path(stage_bundle())
    runtime = [line for line in (first / staging.MANIFEST).read_text().splitlines()
               if line.endswith("  rt/bin/python3")]
    assert Path(stage_bundle()) == first  # reused as it is
    tamper(first)
    staging._verified.clear()  # a new process: nothing hashed yet
    again = Path(stage_bundle())
    assert again == first
    assert runtime[0] in (again / staging.MANIFEST).read_text().splitlines()
    for source in AGENT_SOURCE.glob("*.py"):
        assert (again / AGENT_PACKAGE / source.name).read_bytes() == source.read_bytes()
    assert not (again / AGENT_PACKAGE / "extra.py").exists()
    assert staging.verified(again)
    assert [p.name for p in again.parent.iterdir() if p.name.startswith(".")] == []


def test_the_staging_root_is_a_user_cache_dir_others_can_pass_through(
        monkeypatch: pytest.MonkeyPatch) -> None:
    base = engines.shared_dir()  # reachable by every user, unlike pytest's 0700 tmp
    base.chmod(0o755)
    try:
        monkeypatch.setattr("tempfile.tempdir", str(base / "tmp"))
        (base / "tmp").mkdir()
        (base / "tmp").chmod(0o1777)
        temp_root = base / "tmp" / f"toolseam-{os.geteuid()}"
        cache = base / "cache"
        cache.mkdir()
        cache.chmod(0o755)
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        assert staging.staging_root() == cache / "toolseam"
        assert stat.S_IMODE((cache / "toolseam").stat().st_mode) == 0o711
        cache.chmod(0o700)  # a rootless engine's user could not read a bundle in there
        assert staging.staging_root() == temp_root
        assert stat.S_IMODE(temp_root.stat().st_mode) == 0o711
        cache.chmod(0o777)  # another user could swap ./toolseam for their own
        assert staging.staging_root() == temp_root
    finally:
        engines.remove_shared(base)


def test_check_ancestors_refuses_what_another_user_can_change(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("makes a directory owned by another user")
    uid = os.geteuid()
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    with pytest.raises(staging.UnsafePath, match="writable by others"):
        staging.check_ancestors(tmp_path / "open" / "toolseam", uid)
    (tmp_path / "theirs").mkdir()
    os.chown(tmp_path / "theirs", NOBODY, NOBODY)
    with pytest.raises(staging.UnsafePath, match=f"belongs to uid {NOBODY}"):
        staging.check_ancestors(tmp_path / "theirs" / "toolseam", uid)
    (tmp_path / "sticky").mkdir()
    (tmp_path / "sticky").chmod(0o1777)
    staging.check_ancestors(tmp_path / "sticky" / "toolseam", uid)  # like /tmp: fine


@pytest.mark.engines  # needs an engine without naming it in a parameter
async def test_a_rootless_engine_reads_the_staged_bundle(shared_tmp: Path) -> None:
    """Its user is not this one: the 0711 root and the 0755 bundle below are what it reaches."""
    workspace = engines.shared_dir()
    try:
        async with Toolkit(engines.backend("podman-rootless", str(workspace),
                                           workspace_mode="bind")) as tk:
            assert (await tk.call("bash", {"command": "echo alive"})).output == "alive\n"
    finally:
        engines.remove_shared(workspace)
    assert Path(stage_bundle()).parent == shared_tmp / f"toolseam-{os.geteuid()}"
