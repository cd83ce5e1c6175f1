"""toolseam across a 3-node Ray cluster on this machine (issue 39), in ONE run.

    python benchmarks/ray_pool.py [--claims 32] [--calls 200]

Starts a real cluster (``ray.cluster_utils.Cluster``, 127.0.0.1, one CPU per node, no
dashboard): a docker head, a rootful podman node, a rootless podman node. Measures:

* 32 claims at once from a ``RayPool`` that was full (11 warm per node): time from the burst's
  start to each session's first answer (``bash true``) — p50, max (= wall);
* per call p50 through the cluster vs the same engine opened here (``bash true``, ``read``);
* the node actor's memory (USS) per session: growth with 32 sessions held vs the same growth
  of a process holding 11 sessions of a local ``SandboxPool`` (measured in a child process).

What one machine cannot show: scaling with machines (every node shares these 2 vCPUs and one
engine per kind); see docs/benchmarks.md for how that is estimated.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

IMAGE = os.environ.get("TOOLSEAM_IMAGE", "localhost/toolseam-sandbox:latest")


async def first_answers(toolkits: list[Any], began: float) -> list[float]:
    async def one(tk: Any) -> float:
        await tk.call("bash", {"command": "true"})
        return time.monotonic() - began
    return list(await asyncio.gather(*(one(tk) for tk in toolkits)))


async def per_call_p50(tk: Any, calls: int) -> dict[str, float]:
    await tk.call("write", {"path": "f.txt", "content": "x\n" * 10})
    out: dict[str, float] = {}
    for name, args in (("bash", {"command": "true"}), ("read", {"path": "f.txt"})):
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            await tk.call(name, args)
            times.append(time.perf_counter() - t)
        out[name] = statistics.median(times) * 1000
    return out


def local_pool_uss(sessions: int) -> float:
    """Child process: USS growth per session held from a local SandboxPool (docker)."""
    code = f"""
import asyncio, json, os, psutil, tempfile
from toolseam import SandboxPool
from toolseam.backends.docker import DockerBackend
async def main():
    async with SandboxPool(DockerBackend, size={sessions}, image={IMAGE!r},
                           endpoint=os.environ.get("TOOLSEAM_DOCKER_URL"),
                           workspace_mode="copy") as pool:
        await pool.wait_full()
        before = psutil.Process().memory_full_info().uss
        dirs = [tempfile.mkdtemp() for _ in range({sessions})]
        tks = await asyncio.gather(*(pool.toolkit(d) for d in dirs))
        await asyncio.gather(*(tk.call("bash", {{"command": "true"}}) for tk in tks))
        after = psutil.Process().memory_full_info().uss
        await asyncio.gather(*(tk.close() for tk in tks))
    print(json.dumps((after - before) / {sessions}))
asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-2000:])
    return float(json.loads(done.stdout.strip().splitlines()[-1]))


async def measure(address: str, cluster: Any, claims: int, calls: int,
                  refill: bool) -> dict[str, Any]:
    import ray

    from tests.support.ray_cluster import resource
    from toolseam import Toolkit
    from toolseam.backends.docker import DockerBackend
    from toolseam.ray import RayBackend, RayPool
    from toolseam.ray import cluster as ray_cluster

    results: dict[str, Any] = {}
    # per call, through the cluster vs here (docker)
    work = tempfile.mkdtemp()
    async with Toolkit(RayBackend(resources=resource("docker"), address=address)) as tk:
        await per_call_p50(tk, 20)  # warm-up
        results["ray_per_call_ms"] = await per_call_p50(tk, calls)
    async with Toolkit(DockerBackend(work, image=IMAGE, workspace_mode="copy",
                                     endpoint=os.environ.get("TOOLSEAM_DOCKER_URL"))) as tk:
        await per_call_p50(tk, 20)
        results["local_per_call_ms"] = await per_call_p50(tk, calls)
    # 32 claims at once from a full pool
    nodes = [ray_cluster.node_actor(ray, str(n["NodeID"])) for n in ray_cluster.alive_nodes(ray)]
    async with RayPool(image=IMAGE, size=claims + len(nodes), address=address,
                       refill=refill) as pool:
        t = time.monotonic()
        await pool.wait_full()
        results["pool_fill_s"] = time.monotonic() - t
        before = {i: (await n.stats.remote())["uss"] for i, n in enumerate(nodes)}
        began = time.monotonic()
        toolkits = await asyncio.gather(*(pool.toolkit() for _ in range(claims)))
        firsts = await first_answers(toolkits, began)
        results["claims"] = claims
        results["refill"] = refill
        results["claim_first_answer_p50_s"] = statistics.median(firsts)
        results["claim_first_answer_max_s"] = max(firsts)
        results["claims_per_node"] = pool.claims()
        after = {i: (await n.stats.remote())["uss"] for i, n in enumerate(nodes)}
        grown = sum(after[i] - before[i] for i in before)
        results["node_actor_uss_per_session_mib"] = grown / claims / 2**20
        await asyncio.gather(*(tk.close() for tk in toolkits))
    results["node_actor_uss_mib"] = [(await n.stats.remote())["uss"] / 2**20 for n in nodes]
    results["local_pool_uss_per_session_mib"] = local_pool_uss(11) / 2**20
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=32)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--no-refill", action="store_true",
                        help="the pool does not start replacements during the burst")
    args = parser.parse_args()
    from tests.support.ray_cluster import started

    with started() as made:
        from toolseam.ray import cluster as ray_cluster
        ray_cluster.connect(made.address)
        results = asyncio.run(measure(made.address, made.cluster, args.claims, args.calls,
                                          not args.no_refill))
    results["machine"] = f"{psutil.cpu_count()} vCPU"
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
