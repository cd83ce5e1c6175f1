"""``toolseam mcp --http``: what one tool call costs over HTTP, per way of guarding the server
(issue 44), in ONE run, on 127.0.0.1 or a unix socket only.

    python benchmarks/mcp_http.py [--calls 300] [--modes token,unix] [--server-root DIR]

Per mode a real server process (host backend) and the official ``mcp`` client (stateless
2026-07-28 requests, one HTTP request each): ``--calls`` calls of ``bash true`` after 20 to warm
up; p50/p95 in ms. Modes: ``token`` (loopback, the token the server generated, checked on
every request), ``unix`` (a unix socket of mode 0600, no token), ``open`` (loopback without a
token: only a server from before issue 44 starts that way — pass its checkout as
``--server-root``, e.g. ``--server-root /work/main --modes open``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start(mode: str, work: str, server_root: Path) -> tuple[subprocess.Popen[bytes], str, Any]:
    """The server, its URL and the httpx client that reaches it."""
    where = (f"unix:{work}/mcp.sock" if mode == "unix" else f"127.0.0.1:{free_port()}")
    env = {k: v for k, v in os.environ.items() if k != "TOOLSEAM_MCP_TOKEN"}
    env["PYTHONPATH"] = str(server_root)
    log = Path(work) / f"{mode}.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "toolseam.frontends.cli", "mcp",
                                    "--http", where, "--base-dir", work],
                                   stdout=subprocess.DEVNULL, stderr=out, env=env)
    deadline = time.monotonic() + 30
    while "listening" not in log.read_text():
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{mode}: the server did not start: {log.read_text()}")
        time.sleep(0.05)
    said = log.read_text()
    if mode == "unix":
        return process, "http://localhost/mcp", httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=f"{work}/mcp.sock"))
    headers = {}
    found = re.search(r"generated into (\S+), readable", said)
    if found:
        headers["Authorization"] = f"Bearer {Path(found[1]).read_text().strip()}"
    elif mode == "token":
        raise SystemExit(f"token: this server generated no token: {said}")
    return process, f"http://{where}/mcp", httpx.AsyncClient(headers=headers)


async def measure(url: str, http: Any, calls: int) -> list[float]:
    times = []
    async with http, Client(streamable_http_client(url, http_client=http)) as client:
        for number in range(20 + calls):
            started = time.perf_counter()
            result = await client.call_tool("bash", {"command": "true"})
            elapsed = (time.perf_counter() - started) * 1000
            assert not result.is_error, result
            if number >= 20:
                times.append(elapsed)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--modes", default="token,unix")
    parser.add_argument("--server-root", type=Path, default=ROOT)
    args = parser.parse_args()
    print(f"{'mode':8} {'p50 ms':>8} {'p95 ms':>8}   server from {args.server_root}")
    for mode in args.modes.split(","):
        with tempfile.TemporaryDirectory() as work:
            process, url, http = start(mode, work, args.server_root)
            try:
                times = asyncio.run(measure(url, http, args.calls))
            finally:
                process.terminate()
                process.wait(timeout=30)
        p95 = statistics.quantiles(times, n=20)[18]
        print(f"{mode:8} {statistics.median(times):8.2f} {p95:8.2f}", flush=True)


if __name__ == "__main__":
    main()
