"""The host backend against the whole contract, with and without a pid namespace."""

from __future__ import annotations

from pathlib import Path

from toolseam.backends.host import HostBackend
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


class TestHostBackend(FileContract, ListingContract, ExecContract, ProcessTreeContract,
                      HostDirContract, JobContract, HostileContract, ReadToolContract):
    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        return HostBackend(str(host_dir)), str(host_dir)

    async def survivors(self, sandbox: Sandbox, marker: str) -> list[str]:
        return host_survivors(marker)


class TestHostBackendWithoutNamespace(ExecContract, ProcessTreeContract):
    """The fallback when no pid namespace can be had: a daemonised subreaper agent."""

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        return HostBackend(str(host_dir), pid_namespace=False), str(host_dir)

    async def survivors(self, sandbox: Sandbox, marker: str) -> list[str]:
        return host_survivors(marker)
