"""A copy-mode workspace's snapshot sends only what changed (issue 48, decisions 467-468): the
sandbox's root packs ``/workspace`` (``toolseam_agent/pack.py``), files whose stat key is what
the session's previous snapshot stored without their bytes. On every copy-mode engine (the
remote ones, and docker here in copy mode): after one changed file only that file's bytes are
read, and a restore writes only what differs; the manifest is the very tree the engine's whole
archive gives of the same state (a hostile tree's links, hard links, fifo, set-id file,
non-UTF-8 name and locked directory too), and stays so after any sequence of writes, deletes,
renames, chmods and symlinks between two snapshots and a restore (hypothesis, few examples:
each costs a few calls)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from toolseam import Snapshot, Toolkit
from toolseam.backends.containers import branching
from toolseam.backends.containers.engine.protocol import in_engine_thread
from toolseam.backends.snapshots import DEFAULT_LIMIT, SnapshotStore
from toolseam.backends.snapshots.archive import capture_archive
from toolseam.backends.snapshots.capture import Captured
from toolseam.backends.snapshots.manifest import Entry

from ..support.engines import backend
from ..support.sandbox_trees import EMPTY, OPS, Op, apply_ops, run
from ..support.snapshot_stores import count_ingested

COPY_MODE = [("docker-remote", {}), ("podman-remote", {}),
             ("docker", {"workspace_mode": "copy"})]
IDS = ["docker-remote", "podman-remote", "docker-copy"]


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "store"
    monkeypatch.setenv("TOOLSEAM_SNAPSHOTS", str(root))
    return root


@pytest.fixture
def ingested(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the chunks read out of an archive into the store."""
    return count_ingested(monkeypatch)


async def _whole_archive(tk: Toolkit) -> tuple[list[Entry], list[str]]:
    """The workspace as the engine's whole archive of it gives it (the path before 467)."""
    sandbox = tk.backend.sandbox  # type: ignore[attr-defined]

    def read() -> tuple[list[Entry], list[str]]:
        with sandbox.engine.get_archive(sandbox.container, "/workspace") as chunks:
            taken = capture_archive(chunks, SnapshotStore(), DEFAULT_LIMIT)
        return taken.entries, taken.left_out
    return await in_engine_thread(read)


def _tree(snap: Snapshot) -> tuple[list[Entry], list[str]]:
    manifest = SnapshotStore().load(snap.id)
    return manifest.entries, manifest.left_out


@pytest.fixture
def packed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of the chunks of the workspace's pack (or archive) the host reads."""
    sizes: list[int] = []
    real = branching.capture_archive

    def counting(chunks: Iterable[bytes], *args: Any, **kwargs: Any) -> Captured:
        def counted() -> Iterator[bytes]:
            for chunk in chunks:
                sizes.append(len(chunk))
                yield chunk
        return real(counted(), *args, **kwargs)
    monkeypatch.setattr(branching, "capture_archive", counting)
    return sizes


@pytest.mark.parametrize(("engine", "options"), COPY_MODE, ids=IDS)
async def test_a_snapshot_after_one_change_reads_only_that_file(
        engine: str, options: dict[str, object], workspace: Path, ingested: list[int],
        packed: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    async with Toolkit(backend(engine, str(workspace), **options)) as tk:
        await run(tk, "for d in $(seq 10); do mkdir d$d; for f in $(seq 40); do "
                      "head -c 8192 /dev/urandom > d$d/f$f; done; done")
        first = await tk.snapshot()
        assert sum(ingested) >= 400 * 8192
        ingested.clear()
        packed.clear()
        await run(tk, "echo changed > d3/f7")
        second = await tk.snapshot()
        assert 0 < sum(ingested) < 100, sum(ingested)  # d3/f7 only
        # the nine unchanged directories are a header each (decision 488): d3's 40 headers
        # and 11 directories' — not the 400 files' headers (600 KiB)
        assert sum(packed) < 120_000, sum(packed)
        assert second.size_bytes < 100 < first.size_bytes
        assert _tree(second) == await _whole_archive(tk)
        copied: list[str] = []
        copy_out = SnapshotStore.copy_out

        def counting(self: SnapshotStore, digest: str, fd: int) -> None:
            copied.append(digest)
            copy_out(self, digest, fd)
        monkeypatch.setattr(SnapshotStore, "copy_out", counting)
        await run(tk, "echo again > d5/f1 && echo new > d5/added")
        result = await tk.restore(second)  # only what differs is written (decision 468)
        assert (len(copied), result.written, result.removed) == (1, 1, 1), (copied, result)
        assert await run(tk, "wc -c < d5/f1; ls d5 | wc -l") == "8192\n40\n"
        assert _tree(await tk.snapshot()) == _tree(second)
        ingested.clear()
        await run(tk, "rm d3/f7 && echo changed > d3/f7")  # a new inode: sent again
        await tk.snapshot()
        assert 0 < sum(ingested) < 100, sum(ingested)
        ingested.clear()
        for snap in Snapshot.all():  # the previous snapshot gone: everything is sent again
            snap.delete()
        await tk.snapshot()
        assert sum(ingested) >= 399 * 8192


@pytest.mark.parametrize(("engine", "options"), COPY_MODE, ids=IDS)
async def test_the_pack_gives_the_whole_archives_tree_of_a_hostile_workspace(
        engine: str, options: dict[str, object], workspace: Path) -> None:
    async with Toolkit(backend(engine, str(workspace), **options)) as tk:
        await run(tk, "mkdir -p a/b locked && echo one > a/b/f && ln a/b/f hard && "
                      "ln -s /etc/passwd pw && ln -s ../../x a/b/up && mkfifo fifo && "
                      "printf x > \"$(printf 'n\\377')\" && echo s > suid && chmod 4755 suid "
                      "&& echo in > locked/f && chmod 500 locked && touch -d 2001-01-01 a/b/f "
                      "&& mkdir empty && chmod 1777 empty && echo k > .toolseam-layer-nothere")
        for _ in range(2):  # everything sent, then everything unchanged
            snap = await tk.snapshot()
            assert _tree(snap) == await _whole_archive(tk)
        assert "fifo" in snap.left_out
        assert ".toolseam-layer-nothere" not in {e.path for e in _tree(snap)[0]}
        assert await run(tk, "ls -A | grep -c toolseam-layer") == "1\n"  # its files are gone


@pytest.mark.parametrize(("engine", "options"), COPY_MODE[:2], ids=IDS[:2])
def test_any_changes_between_two_snapshots_give_the_whole_archives_tree(
        engine: str, options: dict[str, object], workspace: Path) -> None:
    loop = asyncio.new_event_loop()
    tk = Toolkit(backend(engine, str(workspace), **options))
    loop.run_until_complete(tk.open())

    async def one(before: list[Op], between: list[Op]) -> None:
        await run(tk, EMPTY)
        await apply_ops(tk, before)
        snap = await tk.snapshot()
        assert _tree(snap) == await _whole_archive(tk)
        await apply_ops(tk, between)
        again = await tk.snapshot()
        assert _tree(again) == await _whole_archive(tk)
        await tk.restore(snap)  # and the first is still exactly what it was
        assert _tree(await tk.snapshot()) == _tree(snap)

    @settings(max_examples=5, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(before=st.lists(OPS, max_size=8), between=st.lists(OPS, max_size=8))
    @example(before=[("write", b"a", b"xyz"), ("mkdir", b"b"), ("write", b"b/c\xff", b"1")],
             between=[("same-size", b"a", b"q"), ("rename", b"b/c\xff", b"d e"),
                      ("chmod", b"b", 0o500), ("symlink", b"c\xff", b"/etc")])
    def check(before: list[Op], between: list[Op]) -> None:
        loop.run_until_complete(one(before, between))

    try:
        check()
    finally:
        loop.run_until_complete(tk.close())
        loop.close()


@pytest.mark.parametrize(("engine", "options"), COPY_MODE[:1], ids=IDS[:1])
async def test_a_tree_its_root_cannot_read_is_taken_through_the_engines_archive(
        engine: str, options: dict[str, object], workspace: Path) -> None:
    """The sandbox's root has no CAP_DAC_OVERRIDE: a directory a command made unsearchable
    stops its pack, and that snapshot reads the engine's whole archive instead (decision 467);
    a restore then empties and refills the workspace (decision 402)."""
    async with Toolkit(backend(engine, str(workspace), **options)) as tk:
        await run(tk, "mkdir -p x/y && echo z > x/y/f && chmod 600 x/y && echo k > kept")
        snap = await tk.snapshot()
        assert "x/y/f" in {e.path for e in _tree(snap)[0]}
        assert _tree(snap) == await _whole_archive(tk)
        await run(tk, "echo changed > kept && touch added")
        await tk.restore(snap)
        assert await run(tk, "cat kept; ls") == "k\nkept\nx\n"
