"""What the branching tests share: a snapshot store of the test's own and the small trees
they snapshot. Each test module keeps its own thin fixture over these (``store``,
``client_store``, ``work``), so its autouse fixtures stay visible where they apply."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from toolseam import Snapshot, Toolkit
from toolseam.backends.snapshots import SnapshotStore

from .trees import Tree, describe


def own_store(path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``path`` as this test's snapshot store (``TOOLSEAM_SNAPSHOTS``): the processes the test
    starts inherit it; a remote server given a store of its own keeps apart from it."""
    monkeypatch.setenv("TOOLSEAM_SNAPSHOTS", str(path))
    return path


def work_tree(path: Path) -> Path:
    """A workspace at ``path`` with a file, an executable, an empty directory and a link."""
    (path / "src" / "empty").mkdir(parents=True)
    (path / "src" / "app.py").write_text("print('v1')\n")
    (path / "run.sh").write_text("#!/bin/sh\n")
    (path / "run.sh").chmod(0o750)
    os.symlink("src/app.py", path / "link")
    return path


async def snapshot_of(source: Path) -> tuple[Snapshot, Tree]:
    """A snapshot of a small tree made in ``source``, taken on the host backend (a snapshot
    serves any backend of this user), and the tree's description."""
    (source / "src").mkdir(parents=True)
    (source / "src" / "app.py").write_text("print('v1')\n")
    (source / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "run.sh").chmod(0o755)
    (source / "empty").mkdir()
    os.symlink("src/app.py", source / "link")
    async with Toolkit("host", base_dir=source) as tk:
        return await tk.snapshot("pool source"), describe(source)


def count_ingested(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the chunks read into any store from now on (what a snapshot sent)."""
    read: list[int] = []
    ingest = SnapshotStore.ingest_from

    def counting(self: SnapshotStore, source: Callable[[], bytes]) -> tuple[str, int]:
        def counted() -> bytes:
            chunk = source()
            read.append(len(chunk))
            return chunk
        return ingest(self, counted)
    monkeypatch.setattr(SnapshotStore, "ingest_from", counting)
    return read
