"""What a job's root costs (decision 345): ``bash true`` p50 on every backend, and 16 sessions
x 40 calls at once, for whichever agent this interpreter imports.

    python benchmarks/job_roots.py [BACKEND ...]            # this checkout's agent
    /work/main/.venv/bin/python benchmarks/job_roots.py     # another checkout's: the "before"

Run the two alternately (A B A B) on an otherwise quiet machine: each prints one JSON line per
backend, ``{"backend", "p50_ms", "burst_calls_per_s", "rounds"}``; docs/benchmarks.md quotes
them. The CPU of a call is not read here: a root is a long-lived process, so the commands'
CPU is no longer in the agent's reaped-children figure (``bench.py --containers`` reads it).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import toolseam
from toolseam import Toolkit

sys.path.insert(0, str(Path(toolseam.__file__).resolve().parents[1]))  # that checkout's tests

from tests.support.engines import EVERY_BACKEND, backend, remove_shared, shared_dir

CALLS = 400
SESSIONS, SESSION_CALLS, ROUNDS = 16, 40, 3


def _toolkit(name: str, workspace: Path) -> Toolkit:
    if name == "host":
        return Toolkit("host", base_dir=str(workspace))
    return Toolkit(backend(name, str(workspace)))


async def _p50(name: str, workspace: Path) -> float:
    async with _toolkit(name, workspace) as tk:
        for _ in range(50):
            await tk.call("bash", {"command": "true"})
        times = []
        for _ in range(CALLS):
            started = time.perf_counter()
            await tk.call("bash", {"command": "true"})
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


async def _burst(name: str, workspace: Path) -> list[float]:
    kits = [_toolkit(name, workspace) for _ in range(SESSIONS)]
    try:
        await asyncio.gather(*(tk.call("bash", {"command": "true"}) for tk in kits))

        async def session(tk: Toolkit) -> None:
            for _ in range(SESSION_CALLS):
                await tk.call("bash", {"command": "true"})

        rates = []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            await asyncio.gather(*(session(tk) for tk in kits))
            rates.append(SESSIONS * SESSION_CALLS / (time.perf_counter() - started))
        return rates
    finally:
        await asyncio.gather(*(tk.close() for tk in kits))


async def main(names: list[str]) -> None:
    for name in names:
        workspace = shared_dir()
        try:
            p50 = await _p50(name, workspace)
            rates = await _burst(name, workspace)
        finally:
            remove_shared(workspace)
        figures: dict[str, Any] = {"backend": name, "p50_ms": round(p50, 3),
                                   "burst_calls_per_s": round(statistics.median(rates)),
                                   "rounds": [round(r) for r in rates]}
        print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or list(EVERY_BACKEND)))
