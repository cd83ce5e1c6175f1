"""The raw sandbox API (``Toolkit.sandbox``) against its contract on every backend: the host
(root here, so it switches users), podman rootful and rootless, docker, and the remote engines in
copy mode (containers drop every capability, so they refuse another user clearly)."""

from __future__ import annotations

import os
from pathlib import Path

from toolseam.backends.host import HostBackend
from toolseam.seam.protocol import BuiltinExec
from toolseam.testing.contract import RawContract

from .engines import backend, shared_dir


class TestHostRaw(RawContract):
    switches_user = os.geteuid() == 0

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        return HostBackend(str(host_dir)), str(host_dir)


class _ContainerRaw(RawContract):
    engine = ""

    def host_root(self, tmp_path: Path) -> Path:
        return shared_dir()

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        return backend(self.engine, str(host_dir)), "/workspace"


class TestPodmanRaw(_ContainerRaw):
    engine = "podman"


class TestPodmanRootlessRaw(_ContainerRaw):
    engine = "podman-rootless"


class TestDockerRaw(_ContainerRaw):
    engine = "docker"


class TestPodmanRemoteRaw(_ContainerRaw):
    engine = "podman-remote"


class TestDockerRemoteRaw(_ContainerRaw):
    engine = "docker-remote"
