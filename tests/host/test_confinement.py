"""Confinement (CONTRACT §5): property tests against realpath, and a symlink-swap race."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam import Toolkit
from toolseam_agent import paths
from toolseam_agent.errors import FsError

COMPONENTS = ["a", "b", "..", ".", "", "in-link", "out-link", "abs-in", "new"]


def _layout(root: Path) -> tuple[Path, Path]:
    base, outside = root / "base", root / "outside"
    (base / "a" / "b").mkdir(parents=True)
    (base / "b").mkdir()
    outside.mkdir()
    (base / "in-link").symlink_to("a")
    (base / "a" / "out-link").symlink_to(outside)
    (base / "out-link").symlink_to("../outside")
    (base / "abs-in").symlink_to(base / "b")
    return base, outside


@given(st.lists(st.sampled_from(COMPONENTS), min_size=1, max_size=6), st.booleans())
@settings(max_examples=400, deadline=None)
def test_confined_resolution_agrees_with_realpath(parts: list[str], trailing: bool) -> None:
    with tempfile.TemporaryDirectory() as root:
        base, _outside = _layout(Path(root))
        given_path = "/".join(parts) + ("/" if trailing else "")
        if not given_path.strip("/"):
            return
        real = os.path.realpath(os.path.join(base, given_path))
        expected_inside = real == str(base) or real.startswith(str(base) + "/")
        try:
            resolved = paths.resolve(str(base), given_path, True)
        except FsError as exc:
            assert exc.code == "outside_base"
            assert not expected_inside, (given_path, real)
            return
        assert expected_inside, (given_path, real)
        assert resolved.canonical == real


def test_realpath_traps_are_refused(tmp_path: Path) -> None:
    base, _outside = _layout(tmp_path)
    (base / "loop").symlink_to("loop")
    for given_path in ("loop", "loop/x", "out-link/", "out-link/../outside/x", "a/out-link/..",
                       "/" + "a/" * 2100):
        with pytest.raises(FsError) as caught:
            paths.resolve(str(base), given_path, True)
        assert caught.value.code == "outside_base", given_path[:40]
    with pytest.raises(FsError) as caught:  # ENAMETOOLONG is refused, never silently cut
        paths.resolve(str(base), "x" * 5000, True)
    assert caught.value.detail == "File name too long"


async def test_swap_race_never_reads_or_writes_outside(tmp_path: Path) -> None:
    base, outside = tmp_path / "base", tmp_path / "outside"
    (base / "d").mkdir(parents=True)
    outside.mkdir()
    (base / "d" / "secret.txt").write_text("INSIDE")
    (outside / "secret.txt").write_text("OUTSIDE")
    (outside / "f.txt").write_text("OUTSIDE")
    stop = threading.Event()
    swaps = 0

    def clear(path: Path) -> None:
        """Remove whatever stands at ``path`` (a write may create "d" in a gap: parents are made)."""
        if path.is_symlink():
            path.unlink(missing_ok=True)
        elif path.exists():
            shutil.rmtree(path, ignore_errors=True)  # racing the writer: the caller retries

    def swapper() -> None:
        nonlocal swaps
        while not stop.is_set():
            os.rename(base / "d", base / "d-real")
            while True:
                clear(base / "d")
                try:
                    os.symlink(outside, base / "d")
                    break
                except FileExistsError:
                    continue
            time.sleep(0.0005)
            while True:
                clear(base / "d")
                try:
                    os.rename(base / "d-real", base / "d")
                    break
                except OSError:
                    continue
            swaps += 1
            time.sleep(0.0005)

    thread = threading.Thread(target=swapper)
    thread.start()
    reads = writes = 0
    try:
        async with Toolkit("host", base_dir=str(base), confine_to_base_dir=True,
                           tools={"bash": False}) as tk:
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline:
                read = await tk.call("read", {"path": "d/secret.txt"})
                assert "OUTSIDE" not in read.output
                reads += not read.is_error
                wrote = await tk.call("write", {"path": "d/f.txt", "content": "from the model"})
                writes += not wrote.is_error
                await tk.call("edit", {"path": "d/f.txt", "oldString": "model", "newString": "MODEL"})
                await asyncio.sleep(0)
    finally:
        stop.set()
        thread.join()
    assert swaps > 100 and reads > 0 and writes > 0
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt", "secret.txt"]
    assert (outside / "f.txt").read_text() == "OUTSIDE"
    assert (outside / "secret.txt").read_text() == "OUTSIDE"


def test_walk_fallback_refuses_like_openat2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where openat2 is refused, the O_NOFOLLOW walk gives the same answers."""
    base, outside = _layout(tmp_path)
    (base / "a" / "f.txt").write_text("x")
    monkeypatch.setattr(paths, "_openat2_usable", False)
    resolved = paths.resolve(str(base), "in-link/f.txt", True)
    os.close(paths.open_path(resolved, os.O_RDONLY))
    # a component swapped for a symlink after resolution: refused, not followed
    swapped = paths.resolve(str(base), "b", True)
    (base / "b").rmdir()
    (base / "b").symlink_to(outside)
    with pytest.raises(FsError) as caught:
        os.close(paths.open_path(swapped, os.O_RDONLY | os.O_DIRECTORY))
    assert caught.value.code == "outside_base"
