"""Interactive processes: what a terminal costs per call, per engine (docs/raw-sandbox.md).

    python benchmarks/pty.py                  # host
    python benchmarks/pty.py --containers     # + podman, rootless podman, docker

Per engine, one session: N times ``pty_start(["true"])`` read to its exit (a start, its end and
the read that reports it); then, on one ``cat`` on a terminal, N round trips of
``pty_write(b"x\\n")`` and reads until the echo and cat's copy are back (what a REPL's line
costs); then ``bash true`` on the same session, for scale. Figures are p50 in ms, one run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolseam import Toolkit


def _backend(engine: str, workspace: str) -> Any:
    if engine == "host":
        return "host"
    from tests.engines import backend
    return backend(engine, workspace)


async def _measure(engine: str, n: int) -> dict[str, float]:
    workspace = tempfile.mkdtemp(prefix="toolseam-bench-pty-")
    if engine != "host":
        from tests.engines import shared_dir
        workspace = str(shared_dir())
    async with Toolkit(_backend(engine, workspace),
                       base_dir=workspace if engine == "host" else None) as tools:
        sandbox = tools.sandbox
        starts = []
        for _ in range(n):
            began = time.perf_counter()
            pty = await sandbox.pty_start(["true"])
            while not (await sandbox.pty_read(pty, yield_ms=5000)).exited:
                pass
            starts.append(time.perf_counter() - began)
        cat = await sandbox.pty_start(["cat"])
        trips = []
        for _ in range(n):
            began = time.perf_counter()
            await sandbox.pty_write(cat, b"x\n")
            seen = b""
            while seen.count(b"x\r\n") < 2:  # the echo, then cat's copy
                seen += (await sandbox.pty_read(cat, yield_ms=5000)).data
            trips.append(time.perf_counter() - began)
        await sandbox.pty_terminate(cat)
        bash = []
        for _ in range(n):
            began = time.perf_counter()
            await tools.call("bash", {"command": "true"})
            bash.append(time.perf_counter() - began)
    return {"start to exit": statistics.median(starts) * 1000,
            "write to echo": statistics.median(trips) * 1000,
            "bash true": statistics.median(bash) * 1000}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", action="store_true")
    parser.add_argument("-n", type=int, default=200)
    args = parser.parse_args()
    engines = ["host"] + (["podman", "podman-rootless", "docker"] if args.containers else [])
    print(f"| engine | pty start to exit | write to echo | bash true | (p50 ms, n={args.n})")
    print("|---|---|---|---|")
    for engine in engines:
        got = await _measure(engine, args.n)
        print(f"| {engine} | {got['start to exit']:.2f} | {got['write to echo']:.2f} | "
              f"{got['bash true']:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
