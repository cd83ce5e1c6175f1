"""Per-call latency, side by side, as ratios measured in ONE run (not a timed test).

    python benchmarks/bench.py                     # host backend vs bare Python vs toolnexus
    python benchmarks/bench.py --containers        # + podman, rootless podman, docker

Every call is made inside one running event loop. Each figure is the median of many calls;
ratios compare figures from the same run on the same machine, which is all that is claimed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

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

    async def measure(label: str, bare: float, ours: float, theirs: float | None) -> None:
        tn = f"{theirs:.3f}" if theirs is not None else "n/a"
        vs = f"{ours / theirs:.2f}x" if theirs else "n/a"
        out.append(row(label, f"{bare:.3f}", f"{ours:.3f}", f"{ours / bare:.2f}x", tn, vs))

    async with Toolkit("host", base_dir=small) as tk:
        bare = time_sync(lambda: subprocess.run(["sh", "-c", "true"], check=True), 300)
        ours = await time_async(lambda: tk.call("bash", {"command": "true"}), 300)
        theirs = await time_async(lambda: nexus["bash"].execute({"command": "true"}), 300) if nexus else None
        await measure("bash `true`", bare, ours, theirs)

        target = os.path.join(small, "small.txt")
        Path(target).write_text("hello\n" * 20)
        bare = time_sync(lambda: Path(target).read_text(), 3000)
        ours = await time_async(lambda: tk.call("read", {"path": "small.txt"}), 3000)
        theirs = await time_async(lambda: nexus["read"].execute({"path": target}), 3000) if nexus else None
        await measure("read (120 B file)", bare, ours, theirs)
        out.append(row("  read: added over bare", "", f"{(ours - bare) * 1000:.0f} us", "", "", ""))

        content = "x" * 100
        wpath = os.path.join(small, "w.txt")
        bare_plain = time_sync(lambda: Path(wpath).write_text(content), 500)
        bare = time_sync(lambda: bare_atomic_write(wpath, content), 500)
        ours = await time_async(lambda: tk.call("write", {"path": "w.txt", "content": content}), 500)
        theirs = await time_async(
            lambda: nexus["write"].execute({"path": wpath, "content": content}), 500) if nexus else None
        await measure("write (atomic+fsync)", bare, ours, theirs)
        out.append(row("  write: added over bare", "", f"{(ours - bare) * 1000:.0f} us", "", "", ""))
        out.append(row("  (bare open+write, no fsync)", f"{bare_plain:.3f}", "", "", "", ""))

    async with Toolkit("host", base_dir=tree, tools={"bash": False}) as tk:
        bare = time_sync(lambda: bare_walk(tree), 7, warmup=1)
        ours = await time_async(lambda: tk.call("glob", {"pattern": "**/*.txt"}), 7, warmup=1)
        theirs = await time_async(lambda: nexus["glob"].execute({"pattern": "**/*.txt", "path": tree}),
                                  7, warmup=1) if nexus else None
        await measure(f"glob ({TREE_FILES} files)", bare, ours, theirs)
        bare = time_sync(lambda: bare_grep(tree, "needle"), 5, warmup=1)
        ours = await time_async(lambda: tk.call("grep", {"pattern": "needle"}), 5, warmup=1)
        theirs = await time_async(lambda: nexus["grep"].execute({"pattern": "needle", "path": tree}),
                                  5, warmup=1) if nexus else None
        await measure(f"grep ({TREE_FILES} files)", bare, ours, theirs)
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--containers", action="store_true", help="also the container backends")
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
        if args.containers:
            from containers import container_table

            print("\n## backends side by side\n")
            print("\n".join(await container_table(tree, small)))
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
