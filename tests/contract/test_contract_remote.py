"""The remote backend against the whole contract: ``RemoteBackend`` hosting the host backend on
a server in a process of its own, through the real unix socket (issue 47). Every case the host
backend passes, it passes through the wire."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
from toolseam.testing.read_tool import ReadToolContract

from ..support.processes import host_survivors
from ..support.remote_server import ServerProcess, remote_server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with remote_server() as running:
        yield running


class TestRemoteHostingHost(FileContract, ListingContract, ExecContract, ProcessTreeContract,
                            HostDirContract, JobContract, HostileContract, ReadToolContract):
    @pytest.fixture(autouse=True)
    def _on(self, server: ServerProcess) -> None:
        self.server = server

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        return self.server.backend(host_dir), str(host_dir)  # type: ignore[return-value]

    async def survivors(self, sandbox: Sandbox, marker: str) -> list[str]:
        return host_survivors(marker)
