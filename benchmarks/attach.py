"""Attach latency: a session's handle to its first call answered, per engine (docs/sessions.md).

    python benchmarks/attach.py                 # host
    python benchmarks/attach.py --containers    # + podman, rootless podman, docker (bind mode)
    python benchmarks/attach.py --remote        # + the remote engines (copy mode: an exec each)

One durable session per engine is opened and detached; then, N times, ``Toolkit.attach(handle)``
plus one ``bash true`` is timed and the session detached again. For scale, the same first call
on a fresh session (open + first call) is timed too, and a ``bash true`` call on an attached
durable session (every line sealed: toolseam_agent/attach_auth.py) against the same call on an
ordinary session, alternated in one run. Figures are p50 of the samples, one run, one event
loop; the Python start-up of a new process is not in them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolseam import Toolkit
from toolseam.seam.lifetime import Durable

ORPHAN_S = 60.0
SETTINGS = {"orphan_timeout_s": ORPHAN_S}


def _backend(engine: str, workspace: str, durable: bool = False) -> Any:
    """The host by name (the toolkit builds it with the settings' lifetime); an engine's
    backend built here, with its lifetime (seam/lifetime.py)."""
    if engine == "host":
        return "host"
    from tests.support.engines import backend
    return backend(engine, workspace,
                   **({"lifetime": Durable(orphan_timeout_s=ORPHAN_S)} if durable else {}))


def _attach_options(engine: str) -> dict[str, Any]:
    if engine != "docker-remote":
        return {}
    from toolseam.backends.containers.engine.attach import TlsFiles
    return {"backend_options": {"tls": TlsFiles.from_dir(
        os.environ["TOOLSEAM_REMOTE_DOCKER_CERT_PATH"])}}


async def per_call(engine: str, workspace: str, calls: int) -> tuple[float, float]:
    """p50 µs of ``bash true`` on a durable session and on an ordinary one, alternated."""
    durable = Toolkit(_backend(engine, workspace, durable=True),
                      base_dir=workspace if engine == "host" else None, settings=SETTINGS)
    plain = Toolkit(_backend(engine, workspace), base_dir=workspace if engine == "host" else None)
    times: dict[int, list[float]] = {0: [], 1: []}
    try:
        for tk in (durable, plain):
            await tk.call("bash", {"command": "true"})
        for i in range(calls * 2):
            tk = (durable, plain)[i % 2]
            started = time.perf_counter()
            await tk.call("bash", {"command": "true"})
            times[i % 2].append(time.perf_counter() - started)
    finally:
        await durable.close()
        await plain.close()
    return statistics.median(times[0]) * 1e6, statistics.median(times[1]) * 1e6


async def measure(engine: str, workspace: str, rounds: int) -> tuple[float, float, float]:
    attach: list[float] = []
    fresh: list[float] = []
    tk = Toolkit(_backend(engine, workspace, durable=True),
                 base_dir=workspace if engine == "host" else None, settings=SETTINGS)
    await tk.open()
    handle = await tk.detach()
    for _ in range(rounds):
        started = time.perf_counter()
        again = await Toolkit.attach(handle, **_attach_options(engine))
        await again.call("bash", {"command": "true"})
        attach.append(time.perf_counter() - started)
        handle = await again.detach()
    last = await Toolkit.attach(handle, **_attach_options(engine))
    await last.close()
    for _ in range(max(3, rounds // 4)):
        started = time.perf_counter()
        cold = Toolkit(_backend(engine, workspace),
                       base_dir=workspace if engine == "host" else None)
        await cold.call("bash", {"command": "true"})
        fresh.append(time.perf_counter() - started)
        await cold.close()
    return (statistics.median(attach) * 1000, min(attach) * 1000,
            statistics.median(fresh) * 1000)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", action="store_true")
    parser.add_argument("--remote", action="store_true")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    engines = ["host"] + (["podman", "podman-rootless", "docker"] if args.containers else []) \
        + (["podman-remote", "docker-remote"] if args.remote else [])
    print("| engine | attach → first call answered, p50 ms | min ms | fresh open + first call, "
          "p50 ms | `bash true` durable (sealed) / ordinary, p50 µs |")
    print("|---|---|---|---|---|")
    for engine in engines:
        workspace = tempfile.mkdtemp(prefix="toolseam-bench-attach-", dir="/tmp")
        os.chmod(workspace, 0o777)
        p50, low, fresh = await measure(engine, workspace, args.rounds)
        sealed, plain = await per_call(engine, workspace, args.rounds * 10)
        print(f"| {engine} | {p50:.1f} | {low:.1f} | {fresh:.1f} | {sealed:.0f} / {plain:.0f} "
              f"({sealed / plain:.2f}x) |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
