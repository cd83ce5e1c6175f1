"""The contract suite on a branch (issue 48): a session forked from another, working in its own
private workspace, and a session restored from a snapshot after its files were changed — each
must be indistinguishable from a fresh session of its backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from toolseam import Toolkit
from toolseam.seam.protocol import BuiltinExec
from toolseam.testing.contract import (
    ExecContract,
    FileContract,
    HostDirContract,
    JobContract,
    ListingContract,
    ProcessTreeContract,
    Sandbox,
)

from ..support.engines import backend, shared_dir
from ..support.processes import host_survivors


class _Branch:
    """Holds the toolkits a binding made, closed after each test (the suite closes only the
    backend it was given)."""

    toolkits: list[Toolkit]

    @pytest_asyncio.fixture(autouse=True)
    async def _own_store(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                         ) -> AsyncIterator[None]:
        monkeypatch.setenv("TOOLSEAM_SNAPSHOTS", str(tmp_path / "store"))
        self.toolkits = []
        yield
        for tk in reversed(self.toolkits):
            await tk.close()

    async def survivors(self, sandbox: Sandbox, marker: str) -> list[str]:
        return host_survivors(marker)

    # The two 84-case slicing tables test how the read tool cuts text, the same code on a branch
    # as on its parent (test_contract_host.py runs them): left out here to keep the suite's time.
    test_read_window_is_a_slice_of_split_lines = None
    test_read_page_is_a_slice_of_lines = None


class TestHostForkedChild(_Branch, FileContract, ListingContract, ExecContract,
                          ProcessTreeContract):
    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        parent = Toolkit("host", base_dir=host_dir)  # empty, as the suite wants the child
        self.toolkits.append(parent)
        (child,) = await parent.fork(1)
        assert isinstance(child, Toolkit)
        self.toolkits.append(child)
        return child.backend, child.base_dir


class TestHostRestoredSession(_Branch, FileContract, ListingContract, HostDirContract,
                              JobContract):
    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        tk = Toolkit("host", base_dir=host_dir)
        self.toolkits.append(tk)
        empty = await tk.snapshot("empty")
        (host_dir / "junk" / "deep").mkdir(parents=True)
        (host_dir / "junk" / "deep" / "f").write_text("x\n")
        (host_dir / "top").write_text("y\n")
        (host_dir / "link").symlink_to("top")
        await tk.restore(empty)
        return tk.backend, str(host_dir)


class TestDockerRemoteRestoredSession(_Branch, FileContract, ExecContract):
    """A copy-mode sandbox made the snapshot's by a restore of what differs (decision 468;
    emptied and refilled before, decision 402): the file and exec
    contracts hold after it. (A container fork's child is an ordinary copy-mode sandbox, which
    test_contract_containers.py's copy-mode bindings cover.)"""

    engine = "docker-remote"

    def host_root(self, tmp_path: Path) -> Path:
        return shared_dir()

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        tk = Toolkit(backend(self.engine, str(host_dir)))
        self.toolkits.append(tk)
        empty = await tk.snapshot("empty")
        await tk.call("bash", {"command": "mkdir -p junk/deep && echo x > junk/deep/f && "
                                          "echo y > top && ln -s top link && chmod 500 junk"})
        await tk.restore(empty)
        return tk.backend, "/workspace"
