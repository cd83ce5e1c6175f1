"""Backends side by side: host, podman, rootless podman, docker — and exec-per-call.

Endpoints come from .engines.env (scripts/setup-engines.sh). Every figure is a p50 from the
same run; ratios are against the host backend (or, for exec-per-call, against our agent).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

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
        "" if execs[n] is None else f"{execs[n] / results[n]['bash true']:.0f}x" for n in names)))
    return out
