"""Bindings of the contract suite to the container backends (bind and copy mode), and a pool
factory for the same suite on pooled sandboxes."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, cast

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

from .engines import backend, shared_dir
from .processes import host_survivors

HOST_FILESYSTEM_CASES = {
    "test_huge_lines_and_sparse_files_are_bounded":
        "writes a 1 GiB sparse file and a 48 MiB line into the host dir during the session",
    "test_a_base_dir_renamed_and_recreated_is_never_written_through":
        "renames the host dir during the session (copy mode writes the host dir only at sync)",
    "test_a_name_a_listing_shows_is_a_usable_path":
        "creates undecodable names in the host dir during the session",
    "test_read_only_files_are_refused":
        "makes a read-only file in the host dir during the session",
}


def _listed(reason: str) -> Any:
    @pytest.mark.skip(reason=f"depends on a filesystem shared with the host: {reason}")
    async def case(self: object) -> None:  # pragma: no cover - never runs
        raise AssertionError
    return case


class ContainerBinding(FileContract, ListingContract, ExecContract, ProcessTreeContract,
                        HostDirContract, JobContract, HostileContract, ReadToolContract):
    engine = ""

    def host_root(self, tmp_path: Path) -> Path:
        return shared_dir()

    def backend_options(self) -> dict[str, Any]:
        """More options of the backend (a durable binding's ``lifetime``)."""
        return {}

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        return backend(self.engine, str(host_dir), **self.backend_options()), "/workspace"

    async def survivors(self, sandbox: Sandbox, marker: str) -> list[str]:
        return host_survivors(marker)  # container processes are host processes in another pid ns


class CopyModeBinding(FileContract, ListingContract, ExecContract, ProcessTreeContract,
                       JobContract, HostileContract, ReadToolContract):
    engine = ""
    locals().update({name: _listed(why) for name, why in HOST_FILESYSTEM_CASES.items()})

    def host_root(self, tmp_path: Path) -> Path:
        return shared_dir()

    def backend_options(self) -> dict[str, Any]:
        """More options of the backend (a durable binding's ``lifetime``)."""
        return {}

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        made = backend(self.engine, str(host_dir), **self.backend_options())
        assert made.workspace_mode == "copy"  # type: ignore[attr-defined]
        return made, "/workspace"

    async def survivors(self, sandbox: Sandbox, marker: str) -> list[str]:
        return host_survivors(marker)  # only the filesystem is separate: same pid namespace


def pool_factory(engine: str) -> Any:
    """The pool's backend class for a test engine: ``engines.backend`` with its endpoint."""
    return functools.partial(cast(Any, backend), engine)

