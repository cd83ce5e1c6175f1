"""Host glob and grep run on the event loop in slices: other tasks keep running, and a cancelled
call stops its walk and closes every directory it held."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from toolseam import Toolkit
from toolseam.backends.agentlink import parts


def make_deep_tree(root: Path, depth: int = 12, files_per_dir: int = 20) -> None:
    """A chain of nested dirs (the walk holds one fd per level) with files at every level."""
    current = root
    for level in range(depth):
        for i in range(files_per_dir):
            (current / f"f{i}.txt").write_text(f"level {level} file {i}\nneedle\n")
        current = current / f"d{level}"
        current.mkdir()


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


async def ticks_during(call: asyncio.Future[object] | asyncio.Task[object]) -> int:
    """How many times another task got to run while ``call`` was running."""
    ticks = 0
    while not call.done():
        ticks += 1
        await asyncio.sleep(0)
    return ticks - 1  # the last pass only saw it done


@pytest.mark.parametrize("tool, args", [("glob", {"pattern": "**/*.txt"}),
                                        ("grep", {"pattern": "needle"})])
async def test_other_tasks_run_while_a_walk_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 tool: str, args: dict[str, str]) -> None:
    make_deep_tree(tmp_path)
    monkeypatch.setattr(parts, "WALK_SLICE_S", 0.0)  # give way at every step
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        call = asyncio.ensure_future(tk.call(tool, args))
        ticks = await ticks_during(call)
        result = await call
    assert not result.is_error and result.metadata["total"] == 240
    assert ticks >= 12  # at least once per directory level


@pytest.mark.parametrize("tool, args", [("glob", {"pattern": "**/*.txt"}),
                                        ("grep", {"pattern": "needle"})])
async def test_cancelled_walk_closes_every_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     tool: str, args: dict[str, str]) -> None:
    make_deep_tree(tmp_path)
    monkeypatch.setattr(parts, "WALK_SLICE_S", 0.0)
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        await tk.open()
        before = open_fds()
        call = asyncio.ensure_future(tk.call(tool, args))
        for _ in range(8):  # let it walk several levels deep: it now holds their fds
            await asyncio.sleep(0)
        assert not call.done()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert open_fds() == before
