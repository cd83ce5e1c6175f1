"""The raw sandbox API (``Toolkit.sandbox``) against its contract on every backend: the host
(root here, so it switches users), podman rootful and rootless, docker, and the remote engines in
copy mode (containers drop every capability, so they refuse another user clearly)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolseam.backends.host import HostBackend
from toolseam.seam.protocol import BuiltinExec
from toolseam.testing.contract import RawContract

from ..support.engines import backend, shared_dir


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


async def test_the_fake_backend_runs_argv_and_refuses_what_it_cannot() -> None:
    """The in-process fake (for tests above the seam) runs a raw argv as one statement of its
    tiny shell and refuses stdin and users clearly, leaving no staged stdin file behind."""
    from toolseam import Toolkit
    from toolseam.seam.errors import CouldNotRunError
    from toolseam.session.raw import UserUnsupportedError
    from toolseam.testing.fake import FakeBackend

    fake = FakeBackend("/workspace")
    async with Toolkit(fake, tools={"bash": False}) as tk:
        done = await tk.sandbox.exec(["echo", "a  b", "c"])
        assert (done.stdout, done.exit_code) == ("a  b c\n", 0)
        with pytest.raises(UserUnsupportedError, match="one user"):
            await tk.sandbox.exec(["echo"], user="nobody")
        with pytest.raises(CouldNotRunError, match="no stdin"):
            await tk.sandbox.exec(["echo"], stdin="x")
        assert not [f for f in fake.files if "toolseam-stdin" in f]
