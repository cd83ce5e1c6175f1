"""A durable session (one that outlives its client, docs/sessions.md) is held to the same
contract as an ordinary one: the whole suite, on the host and on every engine in both
workspace modes, with the backend built durable (``lifetime=Durable(...)``) — as ``Toolkit``
builds it when ``orphan_timeout_s`` is above 0 — and through the remote backend (issue 47): a
server in a process of its own hosting the host backend over its unix socket, and a node of
the Ray cluster hosting podman through ``RayTransport``. The pooled sessions' run is
``test_pool_contract.py``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolseam.backends.host import HostBackend
from toolseam.backends.remote import HostedSpec, RemoteBackend, UnixTransport
from toolseam.ray.placement import Placement
from toolseam.ray.transport import RayTransport
from toolseam.seam.capabilities import DurableSessions, supports
from toolseam.seam.lifetime import Durable
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

from ..support.contract_bindings import ContainerBinding, CopyModeBinding
from ..support.processes import host_survivors
from ..support.ray_cluster import RAY_TESTS, resource
from ..support.remote_server import ServerProcess, remote_server
from ..support.shared_cases import SharedParameterSandbox


def _lifetime() -> Durable:
    return Durable(orphan_timeout_s=120.0)


class _Durable:
    """Mixed in before a binding: its backend, built durable."""

    def backend_options(self) -> dict[str, Any]:
        return {"lifetime": _lifetime()}


class TestDurableHost(FileContract, ListingContract, ExecContract, ProcessTreeContract,
                      HostDirContract, JobContract, HostileContract):
    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        backend = HostBackend(str(host_dir), lifetime=_lifetime())
        assert supports(backend, DurableSessions) and isinstance(backend.lifetime, Durable)
        return backend, str(host_dir)

    async def survivors(self, sandbox: Sandbox, marker: str) -> list[str]:
        return host_survivors(marker)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with remote_server() as running:
        yield running


class TestDurableRemoteHost(ExecContract, JobContract):
    """The host backend's durable sessions, hosted by a remote server (its unix socket): the
    command and job parts, where a durable session's lifetime requests (its state kept after
    every call) meet the wire; the file, listing and hostile parts cross the same rows as an
    ephemeral remote session's (test_contract_remote.py) and a local durable one's (above),
    and the attach itself is tests/host/test_remote_durable.py's."""

    @pytest.fixture(autouse=True)
    def _on(self, server: ServerProcess) -> None:
        self.server = server

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        backend = RemoteBackend(transport=UnixTransport(self.server.directory),
                                hosted=HostedSpec(kind="host",
                                                  options={"workspace": str(host_dir)}),
                                lifetime=_lifetime())
        assert supports(backend, DurableSessions) and isinstance(backend.lifetime, Durable)
        return backend, str(host_dir)  # type: ignore[return-value]

    async def survivors(self, sandbox: Sandbox, marker: str) -> list[str]:
        return host_survivors(marker)


class TestDurablePodman(_Durable, SharedParameterSandbox, ContainerBinding):
    engine = "podman"


class TestDurablePodmanRootless(_Durable, SharedParameterSandbox, ContainerBinding):
    engine = "podman-rootless"


class TestDurableDocker(_Durable, SharedParameterSandbox, ContainerBinding):
    engine = "docker"


class TestDurablePodmanRemote(_Durable, SharedParameterSandbox, CopyModeBinding):
    engine = "podman-remote"


class TestDurableRayRemote(ExecContract):
    """A durable session of ``RemoteBackend`` over ``RayTransport`` on the rootful podman node:
    the command part alone (the whole suite runs through the same transport ephemeral,
    test_contract_ray.py; what durability adds — the node keeping the session for
    another driver — is test_ray_remote_durable.py's)."""

    pytestmark = RAY_TESTS
    address = ""

    @pytest.fixture(autouse=True)
    def _cluster(self, ray_cluster: Any) -> None:
        self.address = ray_cluster.address

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        backend = RemoteBackend(transport=RayTransport(Placement(resource("podman")),
                                                       self.address),
                                hosted=HostedSpec(kind="podman"), lifetime=_lifetime())
        return backend, "/workspace"  # type: ignore[return-value]
