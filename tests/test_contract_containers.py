"""Podman (rootful and rootless) and docker, against the same contract suite as the host."""

from __future__ import annotations

from pathlib import Path

from toolseam.seam.protocol import BuiltinExec
from toolseam.testing.contract import (
    ExecContract,
    FileContract,
    HostDirContract,
    HostileContract,
    JobContract,
    ListingContract,
    ProcessTreeContract,
    Sandbox,
)

from .conftest import host_survivors
from .engines import backend, shared_dir


class _ContainerBinding(FileContract, ListingContract, ExecContract, ProcessTreeContract,
                        HostDirContract, JobContract, HostileContract):
    engine = ""

    def host_root(self, tmp_path: Path) -> Path:
        return shared_dir()

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        return backend(self.engine, str(host_dir)), "/workspace"

    async def survivors(self, sandbox: Sandbox, marker: str) -> list[str]:
        return host_survivors(marker)  # container processes are host processes in another pid ns


class TestPodman(_ContainerBinding):
    engine = "podman"


class TestPodmanRootless(_ContainerBinding):
    engine = "podman-rootless"


class TestDocker(_ContainerBinding):
    engine = "docker"
