"""Sixteen sessions at once, with and without a warm pool (issue 26), in ONE run.

    python benchmarks/pool.py [--engines docker,podman,podman-rootless] [--sessions 16]

For each engine, side by side: 16 sessions opened at once without a pool (each creates and
starts its container) and handed out by a ``SandboxPool`` of 16 that was full — time from the
burst's start to each session's first answer (``bash true``): p50, max and the wall time of the
whole burst; 16 sessions x 40 ``bash true`` calls at once (calls/s); memory per warm sandbox
(the engine's own stats, page cache left out); how fast the pool refills after the burst.
Endpoints come from .engines.env (scripts/setup-engines.sh).
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
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import row

from toolseam import SandboxPool, Toolkit
from toolseam.backends.containers.backend import ContainerBackend
from toolseam.backends.docker import DockerBackend
from toolseam.backends.podman import PodmanBackend

IMAGE = os.environ.get("TOOLSEAM_IMAGE", "localhost/toolseam-sandbox:latest")
CALLS = 40


def _class_and_options(engine: str) -> tuple[type[ContainerBackend], dict[str, Any]]:
    if engine == "docker":
        return DockerBackend, {"image": IMAGE}
    return PodmanBackend, {"image": IMAGE, "rootless": engine == "podman-rootless"}


async def _first_answer(make: Any, started: float) -> tuple[Toolkit, float]:
    tk = await make()
    result = await tk.call("bash", {"command": "true"})
    assert not result.is_error, result.output
    return tk, time.perf_counter() - started


async def _burst(make: Any, sessions: int) -> tuple[list[Toolkit], dict[str, float]]:
    started = time.perf_counter()
    done = await asyncio.gather(*(_first_answer(make, started) for _ in range(sessions)))
    wall = time.perf_counter() - started
    times = sorted(t for _, t in done)
    return [tk for tk, _ in done], {"p50": statistics.median(times), "max": times[-1],
                                    "wall": wall}


async def _calls_per_s(toolkits: list[Toolkit]) -> float:
    async def forty(tk: Toolkit) -> None:
        for _ in range(CALLS):
            await tk.call("bash", {"command": "true"})
    started = time.perf_counter()
    await asyncio.gather(*(forty(tk) for tk in toolkits))
    return len(toolkits) * CALLS / (time.perf_counter() - started)


def _memory_mib(engine: Any, container: str) -> float:
    """The container's memory as the engine reports it, page cache left out (cgroups v1)."""
    response = engine.dialect.request(engine.client, "GET", f"/containers/{container}/stats",
                                      params={"stream": "false"})
    response.raise_for_status()
    memory = response.json().get("memory_stats") or {}
    inner = memory.get("stats") or {}
    cache = inner.get("total_inactive_file", inner.get("cache", 0)) or 0
    usage = float(memory.get("usage", 0) - cache) / (1 << 20)
    # rootless podman on cgroups v1 has no cgroup per container: its "usage" is not one
    return usage if memory.get("limit") and usage < 1024 else float("nan")


def _host_uss_mib(engine: Any, container: str) -> float:
    """What the container's processes hold alone (USS), read on this host."""
    pid = engine.dialect.inspect_container(engine.client, container)["State"]["Pid"]
    top = psutil.Process(pid)
    return sum(p.memory_full_info().uss for p in [top, *top.children(recursive=True)]) / (1 << 20)


async def _measure(engine: str, sessions: int, workspace: str) -> dict[str, Any]:
    cls, options = _class_and_options(engine)
    figures: dict[str, Any] = {}

    async def fresh() -> Toolkit:
        tk = Toolkit(cls(workspace, **options))
        await tk.open()
        return tk

    await (await fresh()).close()  # the bundle staged and verified: every burst alike
    toolkits, cold = await _burst(fresh, sessions)
    await asyncio.gather(*(tk.close() for tk in toolkits))
    figures.update({f"cold {k}": v for k, v in cold.items()})

    async with SandboxPool(cls, size=sessions, **options) as pool:
        figures["mode"] = pool.mode
        started = time.perf_counter()
        await pool.wait_full()
        figures["fill s"] = time.perf_counter() - started
        stats_engine = cls(workspace, **options).sandbox.engine
        memory = await asyncio.gather(*(asyncio.to_thread(_memory_mib, stats_engine, c)
                                        for c in pool.warm_containers))
        uss = await asyncio.gather(*(asyncio.to_thread(_host_uss_mib, stats_engine, c)
                                     for c in pool.warm_containers))
        stats_engine.close()
        figures["memory MiB"] = statistics.median(memory)
        figures["uss MiB"] = statistics.median(uss)
        toolkits, warm = await _burst(lambda: pool.toolkit(workspace), sessions)
        figures.update({f"pool {k}": v for k, v in warm.items()})
        refill_started = time.perf_counter()  # the burst's replacements started with it
        await pool.wait_full()
        figures["refill /s"] = sessions / (time.perf_counter() - refill_started + warm["wall"])
        figures["calls/s"] = await _calls_per_s(toolkits)
        await asyncio.gather(*(tk.close() for tk in toolkits))
    if figures["mode"] != "copy":  # the other way to hand out a workspace, for decision 110
        async with SandboxPool(cls, size=sessions, workspace_mode="copy", **options) as pool:
            await pool.wait_full()
            toolkits, copied = await _burst(lambda: pool.toolkit(workspace), sessions)
            figures.update({f"copy {k}": v for k, v in copied.items()})
            await asyncio.gather(*(tk.close() for tk in toolkits))
    return figures


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--engines", default="docker,podman,podman-rootless")
    parser.add_argument("--sessions", type=int, default=16)
    args = parser.parse_args()
    logging.getLogger("toolseam").setLevel(logging.ERROR)  # the bind-mode root warning, x16
    engines = args.engines.split(",")
    workspace = tempfile.mkdtemp(prefix="toolseam-bench-")
    os.chmod(workspace, 0o777)  # a rootless engine's user must reach it
    Path(workspace, "README").write_text("a small workspace\n")
    try:
        results = {engine: await _measure(engine, args.sessions, workspace) for engine in engines}
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    n = args.sessions
    print(row("", *engines))
    print("|" + "|".join(["-" * 28] + ["-" * 14] * len(engines)) + "|")
    print(row("pool mode", *(str(results[e]["mode"]) for e in engines)))
    for what in ("p50", "max", "wall"):
        print(row(f"{n} opens, no pool: {what} s", *(f"{results[e][f'cold {what}']:.3f}"
                                                      for e in engines)))
        print(row(f"{n} opens, pool of {n}: {what} s", *(f"{results[e][f'pool {what}']:.3f}"
                                                          for e in engines)))
        print(row("  no pool / pool", *(
            f"{results[e][f'cold {what}'] / results[e][f'pool {what}']:.1f}x" for e in engines)))
    for what in ("p50", "max", "wall"):
        print(row(f"pool, copy mode: {what} s", *(
            f"{results[e][f'copy {what}']:.3f}" if f"copy {what}" in results[e] else "(copy above)"
            for e in engines)))
    print(row(f"{n} x {CALLS} bash true, calls/s", *(f"{results[e]['calls/s']:.0f}"
                                                      for e in engines)))
    print(row("warm sandbox, engine stats MiB", *(f"{results[e]['memory MiB']:.1f}"
                                                   for e in engines)))
    print(row("warm sandbox, agent USS MiB", *(f"{results[e]['uss MiB']:.1f}" for e in engines)))
    print(row(f"fill {n} from empty, s", *(f"{results[e]['fill s']:.2f}" for e in engines)))
    print(row("refill after the burst, /s", *(f"{results[e]['refill /s']:.1f}" for e in engines)))
    print(f"load average after the run: {os.getloadavg()[0]:.1f} (a shared 2-CPU VM)")


if __name__ == "__main__":
    asyncio.run(main())
