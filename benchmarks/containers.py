"""Backends side by side: host, podman, rootless podman, docker — and exec-per-call.

Endpoints come from .engines.env (scripts/setup-engines.sh). Every figure is a p50 from the
same run; ratios are against the host backend (or, for exec-per-call, against our agent).
``burst_table``: 16 open sessions per backend running 40 ``bash true`` calls each, all at
once — calls per second, and where the CPU of a call goes (``python benchmarks/containers.py``
runs it alone).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import psutil
from bench import row, time_async, time_sync

from toolseam import Toolkit
from toolseam.backends.docker import DockerBackend
from toolseam.backends.podman import PodmanBackend

IMAGE = os.environ.get("TOOLSEAM_IMAGE", "localhost/toolseam-sandbox:latest")


def _backend(name: str, workspace: str) -> Any:
    if name == "docker":
        return DockerBackend(workspace, image=IMAGE)
    return PodmanBackend(workspace, image=IMAGE, rootless=name == "podman-rootless")


def _toolkit(name: str, workspace: str, **options: Any) -> Toolkit:
    if name == "host":
        return Toolkit("host", base_dir=workspace, **options)
    return Toolkit(_backend(name, workspace), **options)


async def _measure(name: str, tree: str, small: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    cold = []
    for _ in range(3):
        started = time.perf_counter()
        tk = _toolkit(name, small)
        await tk.call("bash", {"command": "true"})  # create -> first call answered
        cold.append(time.perf_counter() - started)
        await tk.close()
    figures["cold start"] = sorted(cold)[1] * 1000
    async with _toolkit(name, small) as tk:
        figures["bash true"] = await time_async(lambda: tk.call("bash", {"command": "true"}), 200)
        await tk.call("write", {"path": "small.txt", "content": "hello\n" * 20})
        figures["read small"] = await time_async(lambda: tk.call("read", {"path": "small.txt"}), 500)
    async with _toolkit(name, tree, tools={"bash": False}) as tk:
        figures["glob 20k"] = await time_async(lambda: tk.call("glob", {"pattern": "**/*.txt"}), 5, warmup=1)
        figures["grep 20k"] = await time_async(lambda: tk.call("grep", {"pattern": "needle"}), 5, warmup=1)
        figures["grep small"] = await time_async(  # one directory, 100 files
            lambda: tk.call("grep", {"pattern": "needle", "path": "d00/e0"}), 50)
    return figures


def _exec_per_call(name: str, small: str) -> float | None:
    """The approach we avoid: an engine exec per call (podman-py / docker SDK exec_run)."""
    if name == "host":
        return None
    backend = _backend(name, small)
    spec_engine = backend.sandbox.engine
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(backend.open())
        container_id = backend.sandbox.container
        container = spec_engine.client.containers.get(container_id)
        return time_sync(lambda: container.exec_run(["sh", "-c", "true"]), 30, warmup=2)
    finally:
        loop.run_until_complete(backend.close())
        loop.close()


async def container_table(tree: str, small: str) -> list[str]:
    names = ["host", "podman", "podman-rootless", "docker"]
    results = {name: await _measure(name, tree, small) for name in names}
    execs = {name: await asyncio.to_thread(_exec_per_call, name, small) for name in names}
    out = [row("p50 ms", *names), "|" + "|".join(["-" * 28] + ["-" * 14] * len(names)) + "|"]
    host = results["host"]
    for metric in ("bash true", "read small", "glob 20k", "grep 20k", "grep small", "cold start"):
        out.append(row(metric, *(f"{results[n][metric]:.3f}" for n in names)))
        if metric != "cold start":
            ratios = (f"{results[n][metric] / host[metric]:.2f}x" for n in names)
            out.append(row(f"  {metric} / host", *ratios))
    out.append(row("exec_run per call (SDK)", *("" if execs[n] is None else f"{execs[n]:.3f}"
                                                 for n in names)))
    out.append(row("  exec_run / agent bash", *(
        "" if (e := execs[n]) is None else f"{e / results[n]['bash true']:.0f}x" for n in names)))
    return out


BURST_SESSIONS, BURST_CALLS, BURST_ROUNDS = 16, 40, 5


def _cpu_of(processes: list[psutil.Process]) -> tuple[float, float]:
    """(own, reaped children's) CPU seconds of some processes; gone ones count nothing."""
    own = children = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        own += times.user + times.system
        children += times.children_user + times.children_system
    return own, children


def _agent_of(tk: Toolkit) -> psutil.Process:
    """A session's agent process: the host backend's, or a container's main process (a host
    process too), found through the engine — never by name, other sessions may be running."""
    backend: Any = tk.backend
    if backend.name == "host":
        launcher = psutil.Process(backend.agent.launcher_pid)
        return [p for p in [launcher, *launcher.children(recursive=True)]
                if "--toolseam-agent" in p.cmdline()][-1]
    container = backend.sandbox.engine.client.containers.get(backend.sandbox.container)
    return psutil.Process(int(container.attrs["State"]["Pid"]))


async def burst_table(small: str, names: list[str]) -> list[str]:
    """16 sessions x 40 ``bash true`` calls at once, per backend: calls/s (median of the
    rounds, the backends' rounds alternating) and the CPU of one call — this process (the
    host end of every session), the agents, the commands (the agents' reaped children).
    Sessions are opened before the clock starts: this is the per-call path, not the open."""
    kits = {name: [_toolkit(name, small) for _ in range(BURST_SESSIONS)] for name in names}
    for name in names:
        await asyncio.gather(*(tk.call("bash", {"command": "true"}) for tk in kits[name]))
    agents = [_agent_of(tk) for kit in kits.values() for tk in kit]
    me = psutil.Process()

    async def session(tk: Toolkit) -> None:
        for _ in range(BURST_CALLS):
            await tk.call("bash", {"command": "true"})

    rates: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in names}
    try:
        for _ in range(BURST_ROUNDS):
            for name in names:
                mine, (agent, kids) = me.cpu_times(), _cpu_of(agents)  # all backends' agents:
                # only this backend's are busy in its round
                started = time.perf_counter()
                await asyncio.gather(*(session(tk) for tk in kits[name]))
                wall = time.perf_counter() - started
                after, (agent2, kids2) = me.cpu_times(), _cpu_of(agents)
                rates[name].append(BURST_SESSIONS * BURST_CALLS / wall)
                for i, used in enumerate(((after.user + after.system) - (mine.user + mine.system),
                                          agent2 - agent, kids2 - kids)):
                    cpu[name][i] += used
    finally:
        await asyncio.gather(*(tk.close() for kit in kits.values() for tk in kit))
    calls = BURST_SESSIONS * BURST_CALLS * BURST_ROUNDS
    out = [row(f"{BURST_SESSIONS} x {BURST_CALLS} bash true", *names),
           "|" + "|".join(["-" * 28] + ["-" * 14] * len(names)) + "|",
           row("calls/s (median of rounds)", *(f"{statistics.median(rates[n]):.0f}" for n in names)),
           row("  rounds: min-max", *(f"{min(rates[n]):.0f}-{max(rates[n]):.0f}" for n in names))]
    for i, label in enumerate(("cpu/call: host process us", "cpu/call: agent us", "cpu/call: command us")):
        out.append(row(label, *(f"{cpu[n][i] / calls * 1e6:.0f}" for n in names)))
    return out


async def _main() -> None:
    names = sys.argv[1:] or ["host", "podman", "docker"]
    with tempfile.TemporaryDirectory(prefix="toolseam-burst-") as small:
        os.chmod(small, 0o777)  # a rootless engine's user must reach it
        print("\n".join(await burst_table(small, names)))


if __name__ == "__main__":
    asyncio.run(_main())
