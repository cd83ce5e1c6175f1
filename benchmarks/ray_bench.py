"""toolseam across a 3-node Ray cluster on this machine (issue 39, item 8), in ONE run.

    python benchmarks/ray_bench.py [--calls 200] [--sessions 64] [--session-calls 40] [--claims 32]
                                   [--per-call-only]

Starts a real cluster (``ray.cluster_utils.Cluster``, 127.0.0.1, one CPU per node, no
dashboard; tests/support/ray_cluster.py): a docker head, a rootful podman node, a rootless
podman node. Prints side by side, each "here" figure from the very backend the node opens
(``NodeConfig.make``: the node's engine, copy mode, an image-only workspace):

* per call p50 (``bash true``, ``read`` of a 10-line file) through the cluster vs here, per
  engine, and the floor under it: one empty call of the node actor from asyncio; and the same
  through the remote backend over ``RayTransport`` (issue 47: Ray as placement + transport);
* Ray's own shape (``toolseam.integrations.ray_sandbox.create``):
  ``ray.get(sb.exec.remote("true"))`` p50 per engine vs ``tools.sandbox.exec`` of the same
  command on the same engine opened here, and the ``duration_seconds`` it reports; and calls
  still running after the direct path's grace (decision 503): the first one's excess (the
  waiter actor's start), a later one's, three ``sleep 1`` at once;
* 64 sessions x 40 calls at once, spread over the 3 nodes vs the same 64 opened here (a third
  on each engine): open wall time, call wall time, calls/s, per call p50;
* 32 claims at once from a ``RayPool`` that was full (no refill): from the burst's start to
  each session's first answer (``bash true``) — p50, max;
* memory: each node actor idle (USS), its growth per session held (64 sessions, 32 claims) vs
  a local ``SandboxPool``'s process per session (a child process).

The load average is printed before and after: quote it with the figures. What one machine
cannot show (scaling with machines) is estimated in docs/benchmarks.md.
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
NODE_NAMES = ("docker", "podman", "rootless")
CONTENT = "x\n" * 10


def ms(seconds: list[float]) -> float:
    return round(statistics.median(seconds) * 1000, 3)


async def per_call(tk: Any, calls: int) -> dict[str, float]:
    """p50 of ``bash true`` and of a ``read``, after a warm-up."""
    await tk.call("write", {"path": "f.txt", "content": CONTENT})
    out: dict[str, float] = {}
    for name, args in (("bash", {"command": "true"}), ("read", {"path": "f.txt"})):
        for _ in range(20):
            await tk.call(name, args)
        times = []
        for _ in range(calls):
            began = time.perf_counter()
            await tk.call(name, args)
            times.append(time.perf_counter() - began)
        out[name] = ms(times)
    return out


def shaped_per_call(address: str, name: str, calls: int) -> dict[str, float]:
    """``ray.get(sb.exec.remote("true"))`` p50 on the node ``name``, after a warm-up: on the
    direct path; through Ray (``TOOLSEAM_RAY_SHAPED_DIRECT=0``: the path every call took
    before decision 340); and ``tools.sandbox.exec(["/bin/bash", "-c", "true"])`` on the same
    engine opened here (what the sandbox runs on its node) — interleaved in rounds of 25, so
    the three see the same load. Also the median ``duration_seconds`` the sandbox reported."""
    import ray

    import toolseam.integrations.ray_sandbox as sandbox
    from tests.support.ray_cluster import resource
    from toolseam import Toolkit
    from toolseam.integrations._ray_sandbox_direct import OFF_VARIABLE

    loop = asyncio.new_event_loop()
    here = Toolkit(local_backend(name))
    loop.run_until_complete(here.open())
    sb = sandbox.create(image=IMAGE, resources=resource(name), address=address)
    paths: dict[str, Any] = {
        "direct": lambda: ray.get(sb.exec.remote("true")),
        "ray": lambda: ray.get(sb.exec.remote("true")),
        "here": lambda: loop.run_until_complete(here.sandbox.exec(["/bin/bash", "-c", "true"]))}
    times: dict[str, list[float]] = {path: [] for path in paths}
    reported = []
    try:
        for _ in range(20):
            ray.get(sb.exec.remote("true"))
            paths["here"]()
        for _ in range(max(1, calls // 25)):
            for path, run in paths.items():
                os.environ[OFF_VARIABLE] = "0" if path == "ray" else "1"
                for _ in range(25):
                    began = time.perf_counter()
                    result = run()
                    times[path].append(time.perf_counter() - began)
                    if path != "here":
                        reported.append(result.duration_seconds)
    finally:
        os.environ.pop(OFF_VARIABLE, None)
        ray.get(sb.delete.remote())
        loop.run_until_complete(here.close())
        loop.close()
    return {"exec": ms(times["direct"]), "exec_through_ray": ms(times["ray"]),
            "here": ms(times["here"]),
            "duration_seconds_p50": round(statistics.median(reported), 6)}


def shaped_running(address: str) -> dict[str, float]:
    """Calls still running after the direct path's grace (their refs are the node actor's
    collect of their answer, decision 511): the first one's excess over its command
    (``sleep 0.2``), a later one's, and three ``sleep 1`` at once from the first ``.remote()``
    to the last answer."""
    import ray

    import toolseam.integrations.ray_sandbox as sandbox
    from tests.support.ray_cluster import resource

    sb = sandbox.create(image=IMAGE, resources=resource("docker"), address=address)
    try:
        for _ in range(5):
            ray.get(sb.exec.remote("true"))
        excess = []
        for _ in range(4):
            began = time.perf_counter()
            ray.get(sb.exec.remote("sleep 0.2"))
            excess.append(time.perf_counter() - began - 0.2)
        began = time.perf_counter()
        ray.get([sb.exec.remote(f"sleep 1; echo {n}") for n in range(3)])
        three = time.perf_counter() - began
    finally:
        ray.get(sb.delete.remote())
    return {"first_running_excess_ms": round(excess[0] * 1000, 3),
            "later_running_excess_ms": ms(excess[1:]),
            "three_sleep_1_at_once_s": round(three, 3)}


async def ray_floor(actor: Any, calls: int) -> float:
    """One empty call of the node actor, awaited from asyncio: what Ray itself costs."""
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        await actor.ready.remote()
        times.append(time.perf_counter() - began)
    return ms(times)


async def many_sessions(make: Any, sessions: int, calls: int, while_held: Any = None,
                        actors: list[Any] | None = None) -> dict[str, float]:
    """``sessions`` toolkits opened at once, then ``calls`` calls each, all at once;
    ``while_held(toolkits)`` is awaited after the calls, before the close. CPU per call: this
    process's, and the node ``actors``' (for the estimate of scaling with machines)."""
    from toolseam import Toolkit

    began = time.monotonic()
    toolkits = [Toolkit(make(i)) for i in range(sessions)]
    await asyncio.gather(*(tk.open() for tk in toolkits))
    opened = time.monotonic() - began
    await asyncio.gather(*(tk.call("write", {"path": "f.txt", "content": CONTENT})
                           for tk in toolkits))
    times: list[float] = []

    async def work(tk: Any) -> None:
        for i in range(calls):
            name, args = (("bash", {"command": "true"}) if i % 2 == 0
                          else ("read", {"path": "f.txt"}))
            t = time.perf_counter()
            await tk.call(name, args)
            times.append(time.perf_counter() - t)

    me = psutil.Process()
    cpu_before = sum(me.cpu_times()[:2])
    actors_before = [(await a.stats.remote())["cpu_s"] for a in actors or []]
    began = time.monotonic()
    await asyncio.gather(*(work(tk) for tk in toolkits))
    wall = time.monotonic() - began
    driver_cpu = sum(me.cpu_times()[:2]) - cpu_before
    actors_after = [(await a.stats.remote())["cpu_s"] for a in actors or []]
    actors_cpu = sum(actors_after) - sum(actors_before)
    result = {"open_wall_s": round(opened, 2), "calls_wall_s": round(wall, 2),
              "calls_per_s": round(sessions * calls / wall), "per_call_p50_ms": ms(times),
              "this_process_cpu_ms_per_call": round(driver_cpu * 1000 / (sessions * calls), 3)}
    if actors:
        result["node_actors_cpu_ms_per_call"] = round(actors_cpu * 1000 / (sessions * calls), 3)
    if while_held is not None:
        await while_held(toolkits)
    await asyncio.gather(*(tk.close() for tk in toolkits))
    return result


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


def local_backend(name: str) -> Any:
    """The backend the node ``name`` opens for a session, made here (same engine, options)."""
    from tests.support.ray_cluster import NODES, node_env
    from toolseam.ray.node_config import NodeConfig

    engine, variable = NODES[name]
    config = NodeConfig.from_env(node_env(engine, name, os.environ.get(variable)))
    return config.make(tempfile.mkdtemp(prefix="toolseam-bench-"), None, None)


async def uss(actors: list[Any]) -> list[float]:
    return [(await a.stats.remote())["uss"] / 2**20 for a in actors]


async def measure(made: Any, args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from tests.support.ray_cluster import resource
    from toolseam import Toolkit
    from toolseam.backends.remote import HostedSpec, RemoteBackend
    from toolseam.ray import RayBackend, RayPool
    from toolseam.ray.actors import node_actor
    from toolseam.ray.placement import Placement
    from toolseam.ray.transport import RayTransport

    address = made.address
    results: dict[str, Any] = {}
    actors = [node_actor(ray, made.node_id(n)) for n in NODE_NAMES]
    await asyncio.gather(*(a.ready.remote() for a in actors))
    results["ray_empty_call_ms"] = await ray_floor(actors[0], args.calls)

    per_engine: dict[str, Any] = {}
    for name in [] if args.shaped_only else NODE_NAMES:
        async with Toolkit(RayBackend(resources=resource(name), address=address)) as tk:
            through = await per_call(tk, args.calls)
        async with Toolkit(local_backend(name)) as tk:
            here = await per_call(tk, args.calls)
        kind = "docker" if name == "docker" else "podman"
        remote = RemoteBackend(transport=RayTransport(Placement(resource(name)), address),
                               hosted=HostedSpec(kind=kind))
        async with Toolkit(remote) as tk:
            through_remote = await per_call(tk, args.calls)
        per_engine[name] = {"cluster": through, "here": here, "remote": through_remote}
    results["per_call_p50_ms"] = per_engine
    shaped: dict[str, Any] = {}
    for name in NODE_NAMES:
        through = await asyncio.to_thread(shaped_per_call, address, name, args.calls)
        shaped[name] = {"cluster": through, "here": through["here"]}
    results["shaped_exec_p50_ms"] = shaped
    results["shaped_running"] = await asyncio.to_thread(shaped_running, address)
    if args.per_call_only or args.shaped_only:
        return results

    idle = await uss(actors)
    results["node_actor_idle_uss_mib"] = [round(x, 1) for x in idle]
    def through_cluster(i: int) -> Any:
        return RayBackend(address=address)  # spread: the node this process placed fewest on

    def here(i: int) -> Any:
        return local_backend(NODE_NAMES[i % len(NODE_NAMES)])

    async def memory(toolkits: list[Any]) -> None:
        holding = await uss(actors)
        results["node_actor_uss_per_session_mib"] = round(
            (sum(holding) - sum(idle)) / len(toolkits), 3)
        nodes = [tk.backend.node_id for tk in toolkits]
        results["sessions_per_node"] = sorted(nodes.count(n) for n in set(nodes))

    results["many_cluster"] = await many_sessions(through_cluster, args.sessions,
                                                  args.session_calls, memory, actors)
    before_here = psutil.Process().memory_full_info().uss

    async def memory_here(toolkits: list[Any]) -> None:
        grown = psutil.Process().memory_full_info().uss - before_here
        results["here_uss_per_session_mib"] = round(grown / len(toolkits) / 2**20, 3)

    results["many_here"] = await many_sessions(here, args.sessions, args.session_calls,
                                               memory_here)

    async with RayPool(image=IMAGE, size=args.claims + len(actors), address=address,
                       refill=False) as pool:
        began = time.monotonic()
        await pool.wait_full()
        results["pool_fill_s"] = round(time.monotonic() - began, 2)
        before = await uss(actors)
        began = time.monotonic()

        async def claim() -> tuple[Any, float]:
            tk = await pool.toolkit()
            await tk.call("bash", {"command": "true"})
            return tk, time.monotonic() - began

        claimed = await asyncio.gather(*(claim() for _ in range(args.claims)))
        firsts = [t for _, t in claimed]
        results["claims"] = {"count": args.claims,
                             "first_answer_p50_s": round(statistics.median(firsts), 3),
                             "first_answer_max_s": round(max(firsts), 3),
                             "per_node": sorted(pool.claims().values())}
        after = await uss(actors)
        results["claims"]["node_actor_uss_per_session_mib"] = round(
            sum(after) - sum(before), 3) / args.claims
        await asyncio.gather(*(tk.close() for tk, _ in claimed))
    results["local_pool_uss_per_session_mib"] = round(local_pool_uss(11) / 2**20, 3)
    return results


def table(r: dict[str, Any]) -> str:
    lines = ["| | through the cluster | opened here |", "|---|---|---|"]
    lines.append(f"| empty node-actor call (Ray's floor) | {r['ray_empty_call_ms']} ms | — |")
    for name, both in r["per_call_p50_ms"].items():
        for tool in ("bash", "read"):
            c, h = both["cluster"][tool], both["here"][tool]
            lines.append(f"| per call p50 `{tool}`, {name} | {c} ms (+{c - h:.2f}) | {h} ms |")
            if "remote" in both:
                m = both["remote"][tool]
                lines.append(f"| per call p50 `{tool}`, {name}, remote backend over "
                             f"RayTransport | {m} ms (+{m - h:.2f}) | {h} ms |")
    for name, both in r["shaped_exec_p50_ms"].items():
        c, h = both["cluster"]["exec"], both["here"]
        r_ = both["cluster"]["exec_through_ray"]
        lines.append(f"| `create()` sandbox, `exec(\"true\")` p50, {name} | {c} ms (+{c - h:.2f}; "
                     f"through Ray {r_} ms, +{r_ - h:.2f}; reports "
                     f"{both['cluster']['duration_seconds_p50']} s) | {h} ms |")
    if "shaped_running" in r:
        s = r["shaped_running"]
        lines.append(f"| `create()` sandbox, running calls: the first's excess / a later one's / "
                     f"three `sleep 1` at once | {s['first_running_excess_ms']} ms / "
                     f"{s['later_running_excess_ms']} ms / {s['three_sleep_1_at_once_s']} s | — |")
    if "many_cluster" not in r:
        return "\n".join(lines)
    for key, label in (("open_wall_s", "open, wall (s)"), ("calls_wall_s", "calls, wall (s)"),
                       ("calls_per_s", "calls/s"), ("per_call_p50_ms", "per call p50 (ms)"),
                       ("this_process_cpu_ms_per_call", "this process's CPU per call (ms)")):
        lines.append(f"| {r['sessions']} sessions x {r['session_calls']}: {label} | "
                     f"{r['many_cluster'][key]} | {r['many_here'][key]} |")
    lines.append(f"| {r['sessions']} sessions x {r['session_calls']}: node actors' CPU per "
                 f"call (ms) | {r['many_cluster']['node_actors_cpu_ms_per_call']} | — |")
    lines.append(f"| {r['sessions']} sessions per node | {r['sessions_per_node']} | "
                 "a third per engine |")
    c = r["claims"]
    lines.append(f"| {c['count']} claims at once, first answer p50 / max | "
                 f"{c['first_answer_p50_s']} / {c['first_answer_max_s']} s "
                 f"(per node {c['per_node']}, pool filled in {r['pool_fill_s']} s) | — |")
    lines.append(f"| memory per session held (USS), {r['sessions']} sessions | "
                 f"{r['node_actor_uss_per_session_mib']} MiB (node actors) | "
                 f"{r['here_uss_per_session_mib']} MiB (this process) |")
    lines.append(f"| memory per session held (USS), {c['count']} claims | "
                 f"{c['node_actor_uss_per_session_mib']:.3f} MiB (node actors) | "
                 f"{r['local_pool_uss_per_session_mib']} MiB (a local pool's process) |")
    lines.append(f"| node actor idle (USS) | {r['node_actor_idle_uss_mib']} MiB | — |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--session-calls", type=int, default=40)
    parser.add_argument("--claims", type=int, default=32)
    parser.add_argument("--per-call-only", action="store_true",
                        help="only the per-call figures (the tool calls and the shaped exec)")
    parser.add_argument("--shaped-only", action="store_true",
                        help="only the Ray-shaped sandbox's exec figures")
    args = parser.parse_args()
    from tests.support.ray_cluster import started

    load_before = os.getloadavg()
    with started() as made:
        from toolseam.ray import cluster as ray_cluster
        ray_cluster.connect(made.address)
        results = asyncio.run(measure(made, args))
    results.update(sessions=args.sessions, session_calls=args.session_calls,
                   machine=f"{psutil.cpu_count()} vCPU",
                   load_before=[round(x, 2) for x in load_before],
                   load_after=[round(x, 2) for x in os.getloadavg()])
    print(json.dumps(results, indent=2))
    print(table(results))


if __name__ == "__main__":
    main()
