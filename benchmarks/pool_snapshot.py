"""A session from a snapshot: opened fresh, or handed out by a snapshot pool (issue 48), in ONE
run, every engine side by side.

    python benchmarks/pool_snapshot.py [--engines docker,podman,podman-rootless]
                                       [--files 1000] [--kib 20] [--sessions 6]

A snapshot of ``--files`` files of ``--kib`` KiB each (taken on the host backend). For each
engine, one session at a time, the time from asking to the first answer (``bash true``):

* ``Toolkit(Backend(dir), snapshot=snap)``: a new container, and the snapshot restored into
  its (empty) directory at open;
* ``SandboxPool(..., snapshot=snap).toolkit()`` from a full pool: a warm container and a warm
  workspace (the restore was done before the ask);
* the same pool with a ``base_dir``: the snapshot restored into it at hand-out.

Each session is closed before the next is asked for, and the pool has the time to refill
(``wait_full``) between them, so each figure is one hand-out alone. Endpoints come from
.engines.env (scripts/setup-engines.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import row

from toolseam import SandboxPool, Snapshot, Toolkit
from toolseam.backends.containers.backend import ContainerBackend
from toolseam.backends.docker import DockerBackend
from toolseam.backends.podman import PodmanBackend

IMAGE = os.environ.get("TOOLSEAM_IMAGE", "localhost/toolseam-sandbox:latest")


def _class_and_options(engine: str) -> tuple[type[ContainerBackend], dict[str, Any]]:
    if engine == "docker":
        return DockerBackend, {"image": IMAGE}
    return PodmanBackend, {"image": IMAGE, "rootless": engine == "podman-rootless"}


async def _first_answer(make: Callable[[], Awaitable[Toolkit]]) -> float:
    started = time.perf_counter()
    tk = await make()
    try:
        result = await tk.call("bash", {"command": "true"})
        assert not result.is_error, result.output
        return time.perf_counter() - started
    finally:
        await tk.close()


async def _measure(engine: str, snap: Snapshot, sessions: int, scratch: str
                   ) -> dict[str, float]:
    cls, pool_options = _class_and_options(engine)
    figures: dict[str, float] = {}
    made = iter(range(1 << 30))

    async def fresh() -> Toolkit:
        # a directory of its own a rootless engine's user can reach (a private workspace of
        # the store cannot be bound for it: docs/branching.md), made the snapshot's at open
        base = os.path.join(scratch, f"{engine}-fresh-{next(made)}")
        os.mkdir(base)
        os.chmod(base, 0o777)  # past the umask
        tk = Toolkit(cls(base, **pool_options), snapshot=snap)
        await tk.open()
        return tk

    await _first_answer(fresh)  # the bundle staged and verified: every figure alike
    figures["fresh"] = statistics.median([await _first_answer(fresh) for _ in range(sessions)])
    async with SandboxPool(cls, size=1, snapshot=snap, **pool_options) as pool:
        warm, into_dir = [], []
        for number in range(sessions):
            await pool.wait_full()
            warm.append(await _first_answer(pool.toolkit))
            await pool.wait_full()
            base = os.path.join(scratch, f"{engine}-{number}")
            os.mkdir(base)
            os.chmod(base, 0o777)  # a rootless engine's user must reach it
            into_dir.append(await _first_answer(lambda base=base: pool.toolkit(base)))
    figures["pool"] = statistics.median(warm)
    figures["pool, base_dir"] = statistics.median(into_dir)
    return figures


def _make_tree(root: Path, files: int, kib: int) -> None:
    for number in range(files):
        folder = root / f"d{number % 20:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"f{number:05d}.txt").write_bytes(os.urandom(kib * 1024))


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default="docker,podman,podman-rootless")
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--kib", type=int, default=20)
    parser.add_argument("--sessions", type=int, default=6)
    args = parser.parse_args()
    logging.getLogger("toolseam").setLevel(logging.ERROR)  # the bind-mode root warning
    engines = args.engines.split(",")
    scratch = tempfile.mkdtemp(prefix="toolseam-bench-")
    os.chmod(scratch, 0o777)
    source = Path(scratch) / "source"
    source.mkdir()
    _make_tree(source, args.files, args.kib)
    async with Toolkit("host", base_dir=source) as tk:
        snap = await tk.snapshot("benchmarks/pool_snapshot.py")
    try:
        results = {engine: await _measure(engine, snap, args.sessions, scratch)
                   for engine in engines}
    finally:
        snap.delete()
        shutil.rmtree(scratch, ignore_errors=True)
    size = args.files * args.kib / 1024
    print(f"a snapshot of {args.files} files, {size:.1f} MiB; median of {args.sessions} "
          "hand-outs, one at a time, ask to first answer")
    print(row("", *engines))
    print("|" + "|".join(["-" * 28] + ["-" * 14] * len(engines)) + "|")
    for what, label in (("fresh", "new sandbox + restore s"), ("pool", "snapshot pool s"),
                        ("pool, base_dir", "snapshot pool, base_dir s")):
        print(row(label, *(f"{results[e][what]:.3f}" for e in engines)))
    print(row("  fresh / pool", *(f"{results[e]['fresh'] / results[e]['pool']:.1f}x"
                                  for e in engines)))
    print(f"load average after the run: {os.getloadavg()[0]:.1f} (a shared 2-CPU VM)")


if __name__ == "__main__":
    asyncio.run(main())
