"""Exposed ports (``tools.sandbox.expose``, issue 35 part 5): what a connection through the
session's channel costs, in ONE run, on 127.0.0.1 only.

    python benchmarks/exposed_port.py [--mb 64] [--rounds 3] [--gets 100] [--backends host,docker]

Per backend, ``python3 -m http.server`` runs in the sandbox (network none in a container) on
its own 127.0.0.1 and serves a file of ``--mb`` MB; from this process, through the exposed
port: the download rate (urllib, 1 MiB reads, median of the rounds) and the p50/p95 of a small
GET on a new connection each time (the host's accept, the open frame, the agent's connect, the
request, the answer). On the host backend the server is on this machine's loopback, so the same
client also goes to it directly: the baseline.

Backends other than host need ``set -a; . .engines.env; set +a`` (scripts/setup-engines.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.engines import backend as engine_backend  # noqa: E402
from toolseam import Toolkit  # noqa: E402

DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def download(url: str) -> float:
    """MB/s of one download, request to last byte."""
    started, size = time.perf_counter(), 0
    with DIRECT.open(url, timeout=600) as response:
        while data := response.read(1 << 20):
            size += len(data)
    return size / 1e6 / (time.perf_counter() - started)


def small_gets(url: str, count: int) -> list[float]:
    """Milliseconds of each small GET, a new connection each."""
    times = []
    for _ in range(count):
        started = time.perf_counter()
        with DIRECT.open(url, timeout=60) as response:
            response.read()
        times.append((time.perf_counter() - started) * 1000)
    return times


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def measure(name: str, mb: int, rounds: int, gets: int) -> list[str]:
    workspace = tempfile.mkdtemp(prefix="toolseam-xp-bench-")
    os.chmod(workspace, 0o777)
    tools = (Toolkit("host", base_dir=workspace) if name == "host"
             else Toolkit(engine_backend(name, workspace)))
    rows = []
    async with tools:
        await tools.sandbox.write_bytes("www/small.txt", b"ok\n")
        made = await tools.sandbox.exec(["sh", "-c", f"head -c {mb}000000 /dev/zero > www/big.bin"])
        assert made.success, made
        port = free_port()
        probe = ("import socket, sys, time\nfor _ in range(300):\n    try:\n"
                 f"        socket.create_connection(('127.0.0.1', {port}), 1).close(); sys.exit(0)\n"
                 "    except OSError:\n        time.sleep(0.05)\nsys.exit(1)")
        started = await tools.sandbox.exec(
            ["sh", "-c", f"python3 -m http.server {port} --bind 127.0.0.1 --directory www "
             '>/dev/null 2>&1 & exec python3 -c "$0"', probe], keep_detached=True, timeout=60)
        assert started.success, started
        exposed = await tools.sandbox.expose(port)
        ways = {"through the port": f"http://{exposed.host}:{exposed.port}"}
        if name == "host":
            ways["direct (baseline)"] = f"http://127.0.0.1:{port}"
        for way, base in ways.items():
            rates = [await asyncio.to_thread(download, f"{base}/big.bin") for _ in range(rounds)]
            times = sorted(await asyncio.to_thread(small_gets, f"{base}/small.txt", gets))
            rows.append(f"| {name}, {way} | {statistics.median(rates):.0f} MB/s | "
                        f"{times[len(times) // 2]:.2f} ms | {times[int(len(times) * 0.95)]:.2f} ms |")
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gets", type=int, default=100)
    parser.add_argument("--backends", default="host,podman,podman-rootless,docker,podman-remote")
    args = parser.parse_args()
    print(f"| {args.mb} MB download, {args.gets} small GETs | rate (median of {args.rounds}) "
          "| GET p50 | GET p95 |\n|---|---:|---:|---:|")
    for name in args.backends.split(","):
        for row in await measure(name, args.mb, args.rounds, args.gets):
            print(row, flush=True)
    print(f"load average: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
