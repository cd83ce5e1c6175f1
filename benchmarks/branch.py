"""Branching sessions (issue 48) on the host backend, in ONE run:

    python benchmarks/branch.py [--files 5000] [--mib 200] [--children 8] [--small-mib 20]

For a workspace of FILES files holding MIB MiB (random bytes, 20 directories), with a store of
its own (TOOLSEAM_SNAPSHOTS in a temp dir, removed after):

* the first ``snapshot()`` (everything stored) and one after a single changed file;
* ``restore()`` after a single changed file;
* ``fork(N)``: from the call until every child has answered its first ``bash true``, while the
  parent keeps calling ``bash true`` — the parent's longest call during the fork is reported;
* the same ``fork(N)`` at ``--small-mib`` (the size dependence);
* disk: what N children that each write 1 MiB and take a snapshot add to the store;
* for scale: N fresh (empty) host sessions opened at once — what starting N agents costs on
  this machine now, the floor under any fork.

Container engines are not measured: their snapshots are not built yet (docs/branching.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from toolseam import Toolkit


class Clock:
    """Wall and this process's CPU seconds (all threads) since it was made: on a shared, loaded
    machine the CPU figure is the steadier of the two."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def ms(pair: tuple[float, float]) -> str:
    return f"{pair[0] * 1000:.0f} ms ({pair[1] * 1000:.0f} ms CPU here)"


def make_workspace(root: Path, files: int, mib: int) -> None:
    each = (mib << 20) // files
    for number in range(files):
        folder = root / f"d{number % 20:02d}"
        folder.mkdir(exist_ok=True)
        (folder / f"f{number:05d}.bin").write_bytes(os.urandom(each))


def store_bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in (store / "objects").rglob("*") if p.is_file())


async def timed_fork(tk: Toolkit, children: int) -> tuple[float, float]:
    """Seconds until every child answered ``bash true``; the parent's longest call meanwhile."""
    longest = 0.0
    done = asyncio.Event()

    async def parent_calls() -> None:
        nonlocal longest
        while not done.is_set():
            began = time.perf_counter()
            await tk.call("bash", {"command": "true"})
            longest = max(longest, time.perf_counter() - began)

    async def fork_and_answer() -> list[Toolkit]:
        kids = [k for k in await tk.fork(children) if isinstance(k, Toolkit)]
        await asyncio.gather(*(k.call("bash", {"command": "true"}) for k in kids))
        return kids

    calls = asyncio.ensure_future(parent_calls())
    began = time.perf_counter()
    kids = await fork_and_answer()
    elapsed = time.perf_counter() - began
    done.set()
    await calls
    for kid in kids:
        await kid.close()
    return elapsed, longest


async def fresh_opens(scratch: Path, children: int) -> float:
    began = time.perf_counter()
    fresh = [Toolkit("host", base_dir=tempfile.mkdtemp(dir=scratch)) for _ in range(children)]
    await asyncio.gather(*(t.call("bash", {"command": "true"}) for t in fresh))
    elapsed = time.perf_counter() - began
    for tk in fresh:
        await tk.close()
    return elapsed


async def run(args: argparse.Namespace) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="branch-bench-"))
    store = scratch / "store"
    os.environ["TOOLSEAM_SNAPSHOTS"] = str(store)
    try:
        for mib in (args.mib, args.small_mib):
            ws = scratch / f"ws-{mib}"
            ws.mkdir()
            make_workspace(ws, args.files, mib)
            async with Toolkit("host", base_dir=ws) as tk:
                clock = Clock()
                first = await tk.snapshot()
                cold = clock.read()
                forks = [await timed_fork(tk, args.children) for _ in range(args.repeat)]
                fork_s = statistics.median(f[0] for f in forks)
                pause = max(f[1] for f in forks)
                print(f"{args.files} files / {mib} MiB: first snapshot {ms(cold)} "
                      f"({first.size_bytes >> 20} MiB stored); fork({args.children}) to every "
                      f"child's first answer {fork_s * 1000:.0f} ms (median of {args.repeat}); "
                      f"parent's longest call meanwhile {pause * 1000:.0f} ms")
                if mib != args.mib:
                    continue
                snaps, restores = [], []
                for round_ in range(args.repeat):
                    target = ws / "d00" / "f00000.bin"
                    target.write_bytes(os.urandom(4096) + bytes([round_]))
                    clock = Clock()
                    await tk.snapshot()
                    snaps.append(clock.read())
                    target.write_bytes(b"changed again")
                    clock = Clock()
                    await tk.restore(first)
                    restores.append(clock.read())
                snaps.sort()
                restores.sort()
                print(f"  after one changed file: snapshot {ms(snaps[len(snaps) // 2])}, "
                      f"restore {ms(restores[len(restores) // 2])} (medians)")
                before = store_bytes(store)
                kids = [k for k in await tk.fork(args.children) if isinstance(k, Toolkit)]
                for kid in kids:
                    Path(kid.base_dir, "mine.bin").write_bytes(os.urandom(1 << 20))
                    await kid.snapshot()
                    await kid.close()
                grown = store_bytes(store) - before
                print(f"  {args.children} children writing 1 MiB each, each snapshotted: the "
                      f"store grew {grown / (1 << 20):.1f} MiB")
            shutil.rmtree(ws)
        floors = [await fresh_opens(scratch, args.children) for _ in range(args.repeat)]
        print(f"{args.children} fresh empty sessions to their first answer: "
              f"{statistics.median(floors) * 1000:.0f} ms (median of {args.repeat})")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    parser.add_argument("--files", type=int, default=5000)
    parser.add_argument("--mib", type=int, default=200)
    parser.add_argument("--small-mib", type=int, default=20)
    parser.add_argument("--children", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
