"""A 100 MB download through the egress proxy vs direct, by the same client (curl), on 127.0.0.1.

    python benchmarks/egress.py [--mb 100] [--rounds 5]

The upstream is ``python -m http.server`` in its own process serving one file; the proxy runs in
this process's event loop behind a TCP listener on 127.0.0.1, as the tests drive it. Three ways,
measured in alternating rounds so machine load hits them alike, median of the rounds:

* direct — curl to the server;
* http — curl with ``--proxy`` (an absolute-URI request, relayed by the proxy);
* tunnel — curl with ``--proxy --proxytunnel`` (a CONNECT tunnel, bytes relayed as they are).

This is the proxy core alone. In a sandbox the bytes will also cross the session's channel (the
agent's listener inside and the tunnel over the channel), which adds to the tunnel figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from toolseam.egress import EgressPolicy, EgressProxy


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_listening(port: int, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


async def curl(url: str, *extra: str) -> float:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--fail", "-o", os.devnull, *extra, url, env=env)
    if await process.wait() != 0:
        raise RuntimeError(f"curl {' '.join(extra)} {url} failed")
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "blob").write_bytes(os.urandom(args.mb * 1024 * 1024))
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                                   str(port)], cwd=directory, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        try:
            wait_listening(port)
            proxy = EgressProxy(EgressPolicy.from_settings({
                "egress_allow": [f"blob.test:{port}"], "egress_private": True,
                "egress_resolve": {"blob.test": "127.0.0.1"}}))
            listener = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
            proxy_url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
            ways = {
                "direct": (f"http://127.0.0.1:{port}/blob", ()),
                "http (absolute URI)": (f"http://blob.test:{port}/blob", ("--proxy", proxy_url)),
                "tunnel (CONNECT)": (f"http://blob.test:{port}/blob",
                                     ("--proxy", proxy_url, "--proxytunnel")),
            }
            times: dict[str, list[float]] = {name: [] for name in ways}
            for url, extra in ways.values():  # warm-up
                await curl(url, *extra)
            for _ in range(args.rounds):
                for name, (url, extra) in ways.items():
                    times[name].append(await curl(url, *extra))
            await proxy.close()
            listener.close()
        finally:
            server.terminate()
            server.wait()
    direct = statistics.median(times["direct"])
    print(f"{args.mb} MB from 127.0.0.1 by curl, median of {args.rounds} rounds")
    print(f"{'way':<22}{'seconds':>9}{'MB/s':>9}{'vs direct':>11}")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:<22}{median:>9.3f}{args.mb / median:>9.0f}{direct / median:>10.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
