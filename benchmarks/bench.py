"""Per-call latency, side by side, as ratios measured in ONE run (not a timed test).

    python benchmarks/bench.py                     # host backend vs bare Python vs toolnexus
    python benchmarks/bench.py --containers        # + podman, rootless podman, docker, and
                                                   #   16 sessions x 40 calls at once

Every call is made inside one running event loop. Each figure is the median of many calls,
and the contenders of a row are measured in alternating blocks (see ``interleaved``); ratios
compare figures from the same run on the same machine, which is all that is claimed.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from toolseam import Toolkit

TREE_FILES = 20_000


def make_tree(root: Path, files: int = TREE_FILES) -> None:
    """files spread over 200 directories two levels deep; every 10th file holds 'needle'."""
    for i in range(files):
        directory = root / f"d{i % 20:02d}" / f"e{(i // 20) % 10}"
        directory.mkdir(parents=True, exist_ok=True)
        body = f"line one {i}\nneedle {i}\n" if i % 10 == 0 else f"line one {i}\nhay {i}\n"
        (directory / f"f{i:05d}.txt").write_text(body)


def p50(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


async def time_async(call: Callable[[], Awaitable[Any]], n: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        await call()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - started)
    return p50(samples)


async def interleaved(calls: dict[str, Callable[[], Any]], n: int, warmup: int = 3,
                      block: int = 10) -> dict[str, float]:
    """p50 of each call, measured in alternating blocks of ``block`` calls.

    On a shared VM the same call drifts by 10-25 % within a minute; alternating the contenders
    block by block exposes them all to the same drift, so their ratio is what it claims to be.
    A call may be sync or async (its result is awaited when it is awaitable).
    """
    async def once(call: Callable[[], Any]) -> float:
        started = time.perf_counter()
        result = call()
        if inspect.isawaitable(result):
            await result
        return time.perf_counter() - started

    for call in calls.values():
        for _ in range(warmup):
            await once(call)
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(max(1, n // block)):
        for name, call in calls.items():
            for _ in range(block):
                samples[name].append(await once(call))
    return {name: p50(values) for name, values in samples.items()}


def time_sync(call: Callable[[], Any], n: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return p50(samples)


def bare_walk(root: str) -> list[str]:
    out: list[str] = []
    stack = [(root, "")]
    while stack:
        path, prefix = stack.pop()
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in (".git", "node_modules"):
                        stack.append((entry.path, prefix + entry.name + "/"))
                elif entry.is_file(follow_symlinks=False):
                    out.append(prefix + entry.name)
    out.sort()
    return out


def bare_grep(root: str, pattern: str) -> list[str]:
    regex = re.compile(pattern)
    hits = []
    for rel in bare_walk(root):
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            for number, line in enumerate(f.read().split("\n"), 1):
                if regex.search(line):
                    hits.append(f"{rel}:{number}:{line}")
    return hits[:100]


def bare_atomic_write(path: str, data: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def toolnexus_tools() -> dict[str, Any] | None:
    try:
        from toolnexus.builtin import create_builtin_tools
    except ImportError:
        return None
    return {tool.name: tool for tool in create_builtin_tools()}


def row(name: str, *cells: str) -> str:
    return f"| {name:<26} | " + " | ".join(f"{c:>12}" for c in cells) + " |"


async def host_table(tree: str, small: str) -> list[str]:
    nexus = toolnexus_tools()
    out = [row("call (p50 ms)", "bare", "toolseam", "ratio", "toolnexus", "ts/tn"),
           "|" + "|".join(["-" * 28] + ["-" * 14] * 5) + "|"]

    def add(label: str, f: dict[str, float]) -> None:
        bare, ours, theirs = f["bare"], f["ours"], f.get("theirs")
        tn = f"{theirs:.3f}" if theirs is not None else "n/a"
        vs = f"{ours / theirs:.2f}x" if theirs else "n/a"
        out.append(row(label, f"{bare:.3f}", f"{ours:.3f}", f"{ours / bare:.2f}x", tn, vs))

    def contenders(bare: Callable[[], Any], ours: Callable[[], Any],
                   theirs: Callable[[], Any] | None) -> dict[str, Callable[[], Any]]:
        calls = {"bare": bare, "ours": ours}
        if nexus is not None and theirs is not None:
            calls["theirs"] = theirs
        return calls

    async with Toolkit("host", base_dir=small) as tk:
        add("bash `true`", await interleaved(contenders(
            lambda: subprocess.run(["sh", "-c", "true"], check=True),
            lambda: tk.call("bash", {"command": "true"}),
            lambda: nexus["bash"].execute({"command": "true"}) if nexus else None), 600))

        target = os.path.join(small, "small.txt")
        Path(target).write_text("hello\n" * 20)
        f = await interleaved(contenders(
            lambda: Path(target).read_text(),
            lambda: tk.call("read", {"path": "small.txt"}),
            lambda: nexus["read"].execute({"path": target}) if nexus else None), 6000, block=50)
        add("read (120 B file)", f)
        out.append(row("  read: added over bare", "", f"{(f['ours'] - f['bare']) * 1000:.1f} us", "", "", ""))

        content = "x" * 100
        wpath = os.path.join(small, "w.txt")
        f = await interleaved({
            **contenders(lambda: bare_atomic_write(wpath, content),
                         lambda: tk.call("write", {"path": "w.txt", "content": content}),
                         lambda: nexus["write"].execute({"path": wpath, "content": content})
                         if nexus else None),
            "plain": lambda: Path(wpath).write_text(content)}, 1000)
        add("write (atomic+fsync)", f)
        added = (f['ours'] - f['bare']) * 1000
        out.append(row("  write: added over bare", "", f"{added:.0f} us", "", "", ""))
        out.append(row("  (bare open+write, no fsync)", f"{f['plain']:.3f}", "", "", "", ""))

    async with Toolkit("host", base_dir=tree, tools={"bash": False}) as tk:
        add(f"glob ({TREE_FILES} files)", await interleaved(contenders(
            lambda: bare_walk(tree),
            lambda: tk.call("glob", {"pattern": "**/*.txt"}),
            lambda: nexus["glob"].execute({"pattern": "**/*.txt", "path": tree}) if nexus else None),
            31, warmup=1, block=1))
        add(f"grep ({TREE_FILES} files)", await interleaved(contenders(
            lambda: bare_grep(tree, "needle"),
            lambda: tk.call("grep", {"pattern": "needle"}),
            lambda: nexus["grep"].execute({"pattern": "needle", "path": tree}) if nexus else None),
            11, warmup=1, block=1))
        # A pattern with few hits: toolnexus stops reading at its limit (100 hits), so only
        # here do both read every file — the like-for-like comparison.
        rare = "needle 1999[0-9]"
        add(f"grep, 10 hits ({TREE_FILES} files)", await interleaved(contenders(
            lambda: bare_grep(tree, rare),
            lambda: tk.call("grep", {"pattern": rare}),
            lambda: nexus["grep"].execute({"pattern": rare, "path": tree}) if nexus else None),
            7, warmup=1, block=1))
        rg = shutil.which("rg")
        if rg is not None:  # ripgrep, as a process per search, as an agent would run it
            f = await interleaved({
                "bare": lambda: subprocess.run([rg, "-n", "--no-heading", "--sort", "path",
                                                "needle", tree], capture_output=True),
                "ours": lambda: tk.call("grep", {"pattern": "needle"})}, 11, warmup=1, block=1)
            out.append(row(f"grep vs rg process ({TREE_FILES})", f"{f['bare']:.3f}",
                           f"{f['ours']:.3f}", f"{f['ours'] / f['bare']:.2f}x", "", ""))
    return out


async def bash_cpu_table(small: str, calls: int = 2000) -> list[str]:
    """Where a host ``bash true`` spends CPU, per call, against bare ``subprocess.run``.

    CPU time is steadier than latency on a shared VM, and it shows what the isolation costs:
    the host process's share, the agent's, and the commands' own.
    """
    out = [row("per call (us)", "wall", "host process", "agent", "command", ""),
           "|" + "|".join(["-" * 28] + ["-" * 14] * 5) + "|"]
    async with Toolkit("host", base_dir=small) as tk:
        for _ in range(100):
            await tk.call("bash", {"command": "true"})
        agent = _agent_process(tk)
        agent_before, mine, wall = agent.cpu_times(), time.process_time(), time.perf_counter()
        for _ in range(calls):
            await tk.call("bash", {"command": "true"})
        agent_after = agent.cpu_times()
        wall, mine = time.perf_counter() - wall, time.process_time() - mine
    own = (agent_after.user - agent_before.user) + (agent_after.system - agent_before.system)
    kids = ((agent_after.children_user - agent_before.children_user)
            + (agent_after.children_system - agent_before.children_system))
    out.append(row("toolseam bash `true`", *(f"{v / calls * 1e6:.0f}" for v in (wall, mine, own, kids)), ""))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    mine, wall = time.process_time(), time.perf_counter()
    for _ in range(calls):
        subprocess.run(["sh", "-c", "true"], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, mine = time.perf_counter() - wall, time.process_time() - mine
    kids = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out.append(row("bare subprocess.run", *(f"{v / calls * 1e6:.0f}" for v in (wall, mine)), "—",
                   f"{kids / calls * 1e6:.0f}", ""))
    return out


async def layers_table(small: str) -> list[str]:
    """A host ``bash true`` through each layer, in one run: the agent's channel alone, the
    seam's ``start`` (SpawnRequest, liveness, AgentExec, the JobStatus), the whole tool call —
    each against a bare ``subprocess.run`` measured in the same alternating blocks."""
    from toolseam.seam.models import SpawnRequest

    async with Toolkit("host", base_dir=small) as tk:
        await tk.call("bash", {"command": "true"})
        backend: Any = tk.backend
        channel, env, jobs = backend.agent.channel, dict(os.environ), iter(range(1 << 62))
        spec = {"argv": ["/bin/sh", "-c", "true"], "cwd": small, "deadline_ms": 60_000,
                "grace_ms": 2000, "stream": False, "output_limit": 1 << 20, "env_id": -1}
        await channel.call("start", job="layers-env", spec={**spec, "env": env}, forget=True)

        def request() -> SpawnRequest:
            return SpawnRequest(job=f"layers-{next(jobs)}", argv=["/bin/sh", "-c", "true"],
                                cwd=small, env=env, deadline_ms=60_000, forget_when_done=True)

        f = await interleaved({
            "bare": lambda: subprocess.run(["sh", "-c", "true"], check=True),
            "channel": lambda: channel.call("start", job=f"layers-{next(jobs)}", spec=spec,
                                            forget=True),
            "seam": lambda: backend.start(request()),
            "tool": lambda: tk.call("bash", {"command": "true"})}, 1000)
    out = [row("bash `true` p50 ms", "bare", "channel", "seam start", "tool call", ""),
           "|" + "|".join(["-" * 28] + ["-" * 14] * 5) + "|",
           row("p50", *(f"{f[k]:.3f}" for k in ("bare", "channel", "seam", "tool")), ""),
           row("vs bare", *(f"{f[k] / f['bare']:.2f}x" for k in ("bare", "channel", "seam", "tool")), "")]
    return out


def _agent_process(tk: Toolkit) -> psutil.Process:
    """The host agent of a toolkit, found among the host backend's launched processes (in its
    pid namespace the agent knows itself as pid 1, so its own answer cannot name it)."""
    launcher = psutil.Process(tk.backend.agent.launcher_pid)  # type: ignore[attr-defined]
    agents = [process for process in [launcher, *launcher.children(recursive=True)]
              if "--toolseam-agent" in " ".join(process.cmdline())]
    return agents[-1]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", action="store_true", help="also the container backends")
    parser.add_argument("--remote", action="store_true",
                        help="also engines without a shared filesystem (copy mode)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="toolseam-bench-") as root:
        tree, small = os.path.join(root, "tree"), os.path.join(root, "small")
        os.makedirs(small)
        make_tree(Path(tree))
        for directory, _, _ in os.walk(root):  # a rootless engine's user must reach the trees
            os.chmod(directory, 0o777)
        print(f"# toolseam benchmarks — {time.strftime('%Y-%m-%d %H:%M')}, python {sys.version.split()[0]}, "
              f"{os.cpu_count()} cpus\n")
        print("## host backend vs bare Python vs toolnexus 0.21.0\n")
        print("\n".join(await host_table(tree, small)))
        print("\n## where a host bash call spends CPU\n")
        print("\n".join(await bash_cpu_table(small)))
        print("\n## a host bash call through each layer\n")
        print("\n".join(await layers_table(small)))
        if args.containers:
            from containers import burst_table, container_table

            print("\n## backends side by side\n")
            print("\n".join(await container_table(tree, small)))
            print("\n## 16 sessions x 40 calls at once\n")
            print("\n".join(await burst_table(small, ["host", "podman", "docker"])))
        if args.remote:
            from remote import remote_table

            print("\n## engines over TCP (copy mode) vs the same engines' sockets\n")
            print("\n".join(await remote_table()))
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
