"""Errors that name a path say which side it was looked for on — this host or the sandbox —
and what to pass instead (issue 33): a container's ``base_dir`` given a host directory was
refused "base_dir … does not exist", naming a directory the user could ``ls``.

Podman is the container backend here (bind mode, and copy mode where the side matters).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam import ConfigurationError, CouldNotRunError, SandboxPool, Settings, Toolkit
from toolseam.backends.host import HostBackend
from toolseam.backends.podman import PodmanBackend

from ..support.contract_bindings import pool_factory
from ..support.engines import IMAGE, backend, endpoint, remove_shared, shared_dir

ENGINE = "podman"


@pytest.fixture
def host_dir() -> Iterator[Path]:
    where = shared_dir()
    (where / "here.txt").write_text("on the host\n")
    yield where
    remove_shared(where)


async def refused(tk: Toolkit) -> str:
    with pytest.raises(ConfigurationError) as caught:
        await tk.open()
    message = str(caught.value)
    assert "\n" not in message
    return message


async def not_run(tk: Toolkit) -> str:
    """A missing workspace keeps its kind (could-not-run, not retryable: every engine's verdict
    before), now with its side."""
    with pytest.raises(CouldNotRunError) as caught:
        await tk.open()
    assert caught.value.retryable is False
    return caught.value.reason


# --- the sandbox's side: base_dir, a command's cwd --------------------------------------------
@pytest.mark.asyncio
async def test_a_container_base_dir_given_a_host_directory_says_to_pass_it_as_the_workspace(
        host_dir: Path) -> None:
    endpoint(ENGINE)
    message = await refused(Toolkit("podman", base_dir=str(host_dir),
                                    backend_options={"image": IMAGE, "workspace": str(host_dir / "..")}))
    assert message.startswith(f"base_dir {host_dir} does not exist inside the sandbox (it is a "
                              "host directory: pass it as the workspace — backend_options="
                              f"{{'workspace': '{host_dir}'}}"), message
    # what it says to pass works
    async with Toolkit("podman", backend_options={"image": IMAGE, "workspace": str(host_dir)}) as tk:
        assert (await tk.call("bash", {"command": "cat here.txt"})).output == "on the host\n"


@pytest.mark.asyncio
async def test_a_container_base_dir_that_is_nowhere_says_where_paths_start(host_dir: Path) -> None:
    endpoint(ENGINE)
    message = await refused(Toolkit(backend(ENGINE, str(host_dir)), base_dir="/srv/nowhere-h33a"))
    assert message == ("base_dir /srv/nowhere-h33a does not exist inside the sandbox (base_dir "
                       "is a path inside the sandbox; the host directory given as the workspace "
                       "is /workspace there)")
    message = await refused(Toolkit(backend(ENGINE, str(host_dir)), base_dir="sub"))
    assert message == "base_dir /workspace/sub does not exist inside the sandbox"


@pytest.mark.asyncio
async def test_the_host_backend_says_this_host(tmp_path: Path) -> None:
    message = await refused(Toolkit(HostBackend(str(tmp_path / "typo"))))
    assert message == f"base_dir {tmp_path / 'typo'} does not exist on this host"
    (tmp_path / "file").write_text("x")
    message = await refused(Toolkit("host", base_dir=str(tmp_path / "file")))
    assert message == f"base_dir {tmp_path / 'file'} is not a directory on this host"


@pytest.mark.asyncio
async def test_a_raw_exec_cwd_says_its_side(host_dir: Path, tmp_path: Path) -> None:
    endpoint(ENGINE)
    async with Toolkit(backend(ENGINE, str(host_dir))) as tk:
        with pytest.raises(FileNotFoundError) as caught:
            await tk.sandbox.exec(["true"], cwd=str(tmp_path))
        assert str(caught.value.strerror).startswith(
            "working directory does not exist inside the sandbox (it is a host directory: pass "
            "it as the workspace"), caught.value.strerror
        assert caught.value.filename == str(tmp_path)
        with pytest.raises(FileNotFoundError) as caught:
            await tk.sandbox.exec(["true"], cwd="missing")
        assert caught.value.strerror == "working directory does not exist inside the sandbox"
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        with pytest.raises(FileNotFoundError) as caught:
            await tk.sandbox.exec(["true"], cwd="missing")
        assert caught.value.strerror == "working directory does not exist on this host"


# --- this host's side: the workspace, a pool's base dir, uploads, the CA file ----------------
@pytest.mark.parametrize("mode", ["bind", "copy"])
@pytest.mark.asyncio
async def test_a_missing_workspace_is_said_to_be_missing_on_this_host_before_any_engine(
        tmp_path: Path, mode: str) -> None:
    # an engine that is not there: the workspace is the host's typo, said first
    tk = Toolkit(PodmanBackend(str(tmp_path / "typo"), image=IMAGE, workspace_mode=mode,  # type: ignore[arg-type]
                               endpoint="unix:///nonexistent/podman.sock"))
    assert await not_run(tk) == (
        f"the workspace {tmp_path / 'typo'} does not exist on this host (it is the host "
        "directory the sandbox sees as /workspace: pass an existing one)")


@pytest.mark.asyncio
async def test_a_workspace_that_is_the_sandboxs_path_says_what_to_pass() -> None:
    tk = Toolkit(PodmanBackend("/workspace/src", image=IMAGE,
                               endpoint="unix:///nonexistent/podman.sock"))
    assert await not_run(tk) == (
        "the workspace /workspace/src does not exist on this host (/workspace/src is a path "
        "inside the sandbox: pass the host directory to appear at /workspace, and a directory "
        "inside it as the Toolkit's base_dir)")


@pytest.mark.asyncio
async def test_a_pool_base_dir_is_looked_for_on_this_host(tmp_path: Path) -> None:
    endpoint(ENGINE)
    async with SandboxPool(pool_factory(ENGINE), size=1) as pool:
        with pytest.raises(ConfigurationError, match=f"base_dir {tmp_path / 'typo'} does not "
                                                     "exist on this host"):
            await pool.toolkit(tmp_path / "typo")


@pytest.mark.asyncio
async def test_uploads_and_downloads_name_the_side_of_each_path(host_dir: Path,
                                                                tmp_path: Path) -> None:
    endpoint(ENGINE)
    for made in (backend(ENGINE, str(host_dir)), HostBackend(str(host_dir))):
        async with Toolkit(made) as tk:
            with pytest.raises(ConfigurationError, match=f"upload: {tmp_path / 'nope'} does "
                                                         "not exist on this host"):
                await tk.upload(str(tmp_path / "nope"), "x")
            (tmp_path / "taken").write_text("")
            with pytest.raises(ConfigurationError, match=f"download: {tmp_path / 'taken'} "
                                                         "already exists on this host"):
                await tk.download("here.txt", str(tmp_path / "taken"))
            with pytest.raises(ConfigurationError, match="does not exist in the"):
                await tk.download("nothing", str(tmp_path / "nothing"))


def test_the_egress_ca_file_is_looked_for_on_this_host() -> None:
    with pytest.raises(ConfigurationError, match="no such file on this host"):
        Settings(limits={"network": "egress"},
                 egress_ca_file="/nonexistent/ca.pem").egress_table()
    assert not os.path.exists("/nonexistent/ca.pem")
