"""The agent for another CPU: arm64, assembled from Debian's arm64 packages on this amd64
machine (scripts/setup-cross.sh makes apt know arm64 and installs qemu-user), then run under
qemu-user and driven through the same seam parts a container backend uses."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam import Toolkit
from toolseam.backends.agentlink.channel import AgentChannel
from toolseam.backends.agentlink.parts import AgentExec, AgentFiles
from toolseam.backends.composed import ComposedBackend
from toolseam.backends.containers.bundle.foreign_arch import build, fetch_sysroot, host_arch, select_bundle
from toolseam.backends.host import LocalAgent
from toolseam.seam.errors import CouldNotRunError
from toolseam.seam.models import SandboxInfo

from ..support.engines import serve_every_builtin

pytestmark = pytest.mark.slow
QEMU = "qemu-aarch64-static"


@pytest.fixture(scope="module")
def arm64_bundle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if host_arch() == "arm64":
        pytest.skip("this machine is arm64: its own bundle is the arm64 one")
    if shutil.which(QEMU) is None:
        if os.environ.get("TOOLSEAM_REQUIRE_ENGINES"):
            pytest.fail(f"{QEMU} is missing (scripts/setup-cross.sh installs it)")
        pytest.skip(f"{QEMU} is missing (run scripts/setup-cross.sh)")
    root = tmp_path_factory.mktemp("arm64")
    fetch_sysroot("arm64", root / "sysroot")
    yield build("arm64", root / "sysroot", root / "bundle")


class _QemuAgentBackend(ComposedBackend):
    """The container backends' file and exec parts on an agent run by qemu-user."""

    name = "arm64-agent"

    def __init__(self, wrapper: Path, workspace: Path) -> None:
        super().__init__(AgentFiles(self._channel), AgentExec(self._channel))
        self.agent = LocalAgent(str(wrapper))
        self.workspace = str(workspace)

    def _channel(self) -> AgentChannel:
        assert self.agent.channel is not None
        return self.agent.channel

    async def open(self) -> SandboxInfo:
        if self._info is None:
            hello = await self.agent.start(namespace=False)
            assert hello["python"].startswith("3.11"), hello
            self._info = SandboxInfo(backend=self.name, workspace=self.workspace, local=True,
                                     pid_namespace=False, agent_pid=int(hello["pid"]))
        return self._info

    async def close(self) -> None:
        await self.agent.stop()


def test_the_bundle_is_arm64(arm64_bundle: Path) -> None:
    for binary in (arm64_bundle / "rt/bin/python3", arm64_bundle / "rt/lib/ld.so"):
        header = binary.read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 183  # EM_AARCH64
    assert (arm64_bundle / "toolseam_agent/server.py").exists()
    assert list((arm64_bundle / "rt/lib/python3.11/lib-dynload").glob("*aarch64*.so"))


async def test_the_arm64_agent_serves_every_builtin(arm64_bundle: Path, tmp_path: Path) -> None:
    rt = arm64_bundle / "rt"
    wrapper = tmp_path / "python-arm64"
    wrapper.write_text(f'#!/bin/sh\nexec {QEMU} {rt}/lib/ld.so --library-path {rt}/lib '
                       f'{rt}/bin/python3 "$@"\n')
    wrapper.chmod(0o755)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    async with Toolkit(_QemuAgentBackend(wrapper, workspace), base_dir=str(workspace)) as tk:
        await serve_every_builtin(tk, "arm64 agent")
    assert (workspace / "p.txt").read_text() == "patched\n"


def test_an_engine_of_another_cpu_gets_its_bundle_or_a_clear_error(tmp_path: Path) -> None:
    local = "/tmp/toolseam-bundle-local"
    mine = host_arch()
    other = "arm64" if mine == "amd64" else "amd64"
    assert select_bundle(mine, local, {}) == local
    built = tmp_path / "built"
    (built / "rt").mkdir(parents=True)
    (built / "rt" / "ready").write_text(other)
    assert select_bundle({"amd64": "x86_64", "arm64": "aarch64"}[other], local,
                         {other: str(built)}) == str(built)
    with pytest.raises(CouldNotRunError, match="is incomplete"):
        select_bundle(other, local, {other: str(tmp_path / "empty")})
    with pytest.raises(CouldNotRunError, match=f"runs {other}.*python -m "
                       f"toolseam.backends.containers.bundle.foreign_arch {other}") as caught:
        select_bundle(other, local, {})
    assert not caught.value.retryable
