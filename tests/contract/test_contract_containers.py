"""Podman (rootful and rootless) and docker, against the same contract suite as the host (the
rows of a read-only table share a sandbox: ``support/shared_cases.py``)."""

from __future__ import annotations

from toolseam.testing.contract import (
    HostDirContract,
    HostileContract,
)

from ..support.contract_bindings import HOST_FILESYSTEM_CASES, ContainerBinding, CopyModeBinding
from ..support.shared_cases import SharedParameterSandbox


class TestPodman(SharedParameterSandbox, ContainerBinding):
    engine = "podman"


class TestPodmanRootless(SharedParameterSandbox, ContainerBinding):
    engine = "podman-rootless"


class TestDocker(SharedParameterSandbox, ContainerBinding):
    engine = "docker"


# Copy mode (engines that share no filesystem with this host): every contract case runs except
# these, which arrange files in the host dir *while the sandbox runs* and expect the sandbox to
# see them at once — that is what a shared filesystem means. Listed, and reported as skips
# with the reason; docs/containers.md lists them too.
HOST_DIR_CONTRACT = "HostDirContract (symlinks, FIFOs and modes made in the host dir during the session)"


class TestPodmanRemote(SharedParameterSandbox, CopyModeBinding):
    engine = "podman-remote"


class TestDockerRemote(SharedParameterSandbox, CopyModeBinding):
    engine = "docker-remote"


def test_every_listed_case_exists_and_uses_the_host_dir() -> None:
    """The list cannot go stale: each entry names a real contract case that touches host_dir."""
    import inspect
    for name in HOST_FILESYSTEM_CASES:
        source = inspect.getsource(getattr(HostileContract, name))
        assert "host_dir" in source, name
    assert all("host_dir" in inspect.getsource(v) for k, v in vars(HostDirContract).items()
               if k.startswith("test_"))
    assert HOST_DIR_CONTRACT.startswith(HostDirContract.__name__)
