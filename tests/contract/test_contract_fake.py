"""The in-process fake backend honours the parts of the contract it models."""

from __future__ import annotations

from pathlib import Path

from toolseam.seam.protocol import BuiltinExec
from toolseam.testing.contract import ExecContract, FileContract, JobContract, ListingContract
from toolseam.testing.fake import FakeBackend
from toolseam.testing.read_tool import ReadToolContract


class TestFakeBackend(FileContract, ListingContract, ExecContract, JobContract, ReadToolContract):
    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        return FakeBackend("/workspace"), "/workspace"
