"""What live output costs per call through a Ray cluster (issue 39, item 2), in ONE run.

    python benchmarks/ray_streaming.py [--calls 200]

Starts the test cluster (tests/support/ray_cluster.py: 3 nodes on 127.0.0.1) and times, on
the docker node, ``start`` of a short command (``echo hi``) three ways — p50 and p90:

* ``plain``: no stream asked (one actor call; what every non-streamed call costs);
* ``batched``: ``stream=True`` carried by one plain actor call, the chunks handed over when
  it returns (how streamed starts went before: not live);
* ``live``: ``stream=True`` through the long poll of toolseam/ray/streaming.py (the chunks
  as they come, then the status);
* ``remote plain`` / ``remote live``: the same two through the remote backend over
  ``RayTransport`` (issue 47: its calls on the node's direct port, its streams the same long
  poll on that route, decision 469).

Ray's streaming generator (an async generator method of the node actor called with
``num_returns="streaming"``) was measured the same way before the long poll replaced it
(decision 301): p50 5.2-6.2 ms against 3.5-4.0 ms plain, one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def spawn(stream: bool) -> Any:
    from toolseam.seam.models import SpawnRequest
    return SpawnRequest(job=f"b-{uuid.uuid4().hex[:8]}", argv=["/bin/sh", "-c", "echo hi"],
                        cwd="/workspace", env={"PATH": "/usr/bin:/bin"}, stream=stream,
                        forget_when_done=True)


async def timed(backend: Any, how: str, calls: int) -> dict[str, float]:
    times = []
    for _ in range(calls):
        request = spawn(how != "plain")
        t = time.perf_counter()
        if how == "batched":  # the plain call carrying a stream, chunks at its return
            await backend._call("start", request)
        else:
            await backend.start(request, (lambda c: None) if how == "live" else None)
        times.append(time.perf_counter() - t)
    times.sort()
    return {"p50_ms": round(statistics.median(times) * 1000, 2),
            "p90_ms": round(times[int(len(times) * 0.9)] * 1000, 2)}


async def measure(address: str, calls: int) -> dict[str, Any]:
    from tests.support.ray_cluster import resource
    from toolseam.backends.remote import HostedSpec, RemoteBackend
    from toolseam.ray import RayBackend
    from toolseam.ray.placement import Placement
    from toolseam.ray.transport import RayTransport

    backend = RayBackend(resources=resource("docker"), address=address)
    remote = RemoteBackend(transport=RayTransport(Placement(resource("docker")), address),
                           hosted=HostedSpec(kind="docker"))
    ways = {"plain": (backend, "plain"), "batched": (backend, "batched"),
            "live": (backend, "live"), "remote plain": (remote, "plain"),
            "remote live": (remote, "live")}
    await backend.open()
    await remote.open()
    try:
        for on, how in ways.values():  # warm-up
            await timed(on, how, 20)
        results: dict[str, list[dict[str, float]]] = {}
        for _ in range(2):  # interleaved rounds: the machine's load moves
            for name, (on, how) in ways.items():
                results.setdefault(name, []).append(await timed(on, how, calls))
        return results
    finally:
        await backend.close()
        await remote.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    from tests.support.ray_cluster import started

    with started() as made:
        from toolseam.ray import cluster as ray_cluster
        ray_cluster.connect(made.address)
        results: dict[str, Any] = asyncio.run(measure(made.address, args.calls))
    results["machine"] = f"{psutil.cpu_count()} vCPU"
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
