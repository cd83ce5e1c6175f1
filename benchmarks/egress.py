"""Egress speed (issue 21, point 7; issue 36, part 5), in ONE run, on 127.0.0.1 only.

    python benchmarks/egress.py [--mb 100] [--rounds 3] [--backends host,docker,...] [--profile]
    python benchmarks/egress.py --core            # the proxy core alone, by curl

Default: per backend side by side, a sandbox in egress mode downloads a file from an upstream on
the host's 127.0.0.1 (``python -m http.server`` in its own process) with a Python urllib client
whose every byte crosses the agent's listener inside and the proxy (and, where the agent does
not share this kernel, the session channel; elsewhere the lane hands the socket over); the
same client (the same code, run by the host's python3 — the image's is the same 3.11) downloads
it directly from the host. Ways alternate within each round; median of the rounds; the client
times itself from its request to its last byte (interpreter start left out).

Then, per backend, the p50 of a tool call (``bash true``) idle and while a download loop runs in
the same sandbox, in alternating blocks (``--blocks`` of each, idle first and last).

``--profile``: the host backend's tunnel download again under cProfile (this process: proxy,
channel, tunnel), and the CPU seconds each side spent (this process vs the sandbox's agent and
the client) — where the time goes when a target is missed.

``--core``: the proxy core alone behind a TCP listener, curl direct / absolute URI / CONNECT.

Backends other than host need ``set -a; . .engines.env; set +a`` (scripts/setup-engines.sh).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from toolseam import Toolkit
from toolseam.egress import EgressPolicy, EgressProxy

ROOT = Path(__file__).resolve().parent.parent
# The client, as a file in the sandbox's workspace and on the host (the same code both places).
CLIENT = '''
import json, os, sys, time, urllib.request
def once(url):
    started = time.perf_counter()
    size = 0
    with urllib.request.urlopen(url, timeout=600) as response:
        while data := response.read(1 << 20):
            size += len(data)
    return size, time.perf_counter() - started
if sys.argv[1] == "loop":  # download again and again until the file "stop" appears
    count = 0
    while not os.path.exists("stop"):
        once(sys.argv[2])
        count += 1
    print(json.dumps({"downloads": count}))
else:
    size, seconds = once(sys.argv[1])
    print(json.dumps({"bytes": size, "seconds": seconds}))
'''
ALL = ("host", "podman", "podman-rootless", "docker", "podman-remote", "docker-remote")


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


def make_backend(name: str, workspace: str) -> Any:
    """A container backend in egress mode, endpoints as the tests take them (.engines.env)."""
    from toolseam.backends.containers.engine.attach import TlsFiles
    from toolseam.backends.docker import DockerBackend
    from toolseam.backends.podman import PodmanBackend
    from toolseam.policy.limits import SandboxLimits

    limits = SandboxLimits(network="egress")
    image = os.environ["TOOLSEAM_REMOTE_IMAGE" if name.endswith("-remote") else "TOOLSEAM_IMAGE"]
    if name == "docker":
        return DockerBackend(workspace, image=image, endpoint=os.environ["TOOLSEAM_DOCKER_URL"],
                             limits=limits)
    if name == "docker-remote":
        return DockerBackend(workspace, image=image, endpoint=os.environ["TOOLSEAM_REMOTE_DOCKER_URL"],
                             tls=TlsFiles.from_dir(os.environ["TOOLSEAM_REMOTE_DOCKER_CERT_PATH"]),
                             limits=limits)
    variable = {"podman": "TOOLSEAM_PODMAN_URL", "podman-rootless": "TOOLSEAM_PODMAN_ROOTLESS_URL",
                "podman-remote": "TOOLSEAM_REMOTE_PODMAN_URL"}[name]
    return PodmanBackend(workspace, image=image, endpoint=os.environ[variable],
                         rootless=name == "podman-rootless", limits=limits)


def workspace_dir() -> str:
    """A directory every engine's user can reach (a rootless engine's user too)."""
    path = tempfile.mkdtemp(prefix="toolseam-egress-bench-")
    os.chmod(path, 0o777)
    return path


class Sandbox:
    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.workspace = workspace_dir()
        settings = {"limits": {"network": "egress"}, "egress_allow": [f"blob.test:{port}"],
                    "egress_resolve": {"blob.test": "127.0.0.1"}, "egress_private": True}
        self.tk = (Toolkit("host", base_dir=self.workspace, settings=settings) if name == "host"
                   else Toolkit(make_backend(name, self.workspace), settings=settings))
        self.python = sys.executable if name == "host" else "python3"
        self.url = f"http://blob.test:{port}/blob"

    async def open(self) -> None:
        await self.tk.open()
        written = await self.tk.call("write", {"path": "client.py", "content": CLIENT})
        assert not written.is_error, written.output

    async def download(self) -> float:
        result = await self.tk.call("bash", {"command": f"{self.python} client.py {self.url}",
                                             "timeout": 600_000})
        assert not result.is_error, result.output

        return float(json.loads(result.output)["seconds"])

    async def true_ms(self, n: int) -> list[float]:
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            result = await self.tk.call("bash", {"command": "true"})
            samples.append((time.perf_counter() - started) * 1000)
            assert not result.is_error, result.output
        return samples

    async def true_ms_under_download(self, n: int) -> tuple[list[float], int]:
        await self.tk.call("bash", {"command": "rm -f stop"})
        loop = asyncio.ensure_future(self.tk.call("bash", {
            "command": f"{self.python} client.py loop {self.url}", "timeout": 600_000}))
        await asyncio.sleep(1.0)  # the first download under way
        assert not loop.done(), loop.result().output
        busy = await self.true_ms(n)
        await self.tk.call("write", {"path": "stop", "content": ""})
        result = await loop
        assert not result.is_error, result.output

        return busy, int(json.loads(result.output)["downloads"])

    async def idle_and_busy(self, n: int, blocks: int) -> tuple[float, float, int]:
        """p50 of ``bash true`` idle and during a download, in alternating blocks (idle,
        busy, ..., idle): a shared machine's drift falls on both alike."""
        idle = await self.true_ms(n)
        busy: list[float] = []
        downloads = 0
        for _ in range(blocks):
            samples, count = await self.true_ms_under_download(n)
            busy += samples
            downloads += count
            idle += await self.true_ms(n)
        return statistics.median(idle), statistics.median(busy), downloads

    async def close(self) -> None:
        await self.tk.close()
        subprocess.run(["rm", "-rf", self.workspace], check=False)


def direct(port: int, client: Path) -> float:
    """The same client on the host, straight to the server (no proxy in its environment)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    done = subprocess.run(["python3", str(client), f"http://127.0.0.1:{port}/blob"],
                          capture_output=True, text=True, env=env, check=True)
    import json
    return float(json.loads(done.stdout)["seconds"])


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.Error:
            continue
    return total


async def profile_host(sandbox: Sandbox) -> None:
    """One more tunnel download on the host backend: where this process's time goes, and the
    CPU each side spent."""
    launcher = sandbox.tk.backend.agent.launcher_pid  # type: ignore[attr-defined]
    agent_side = [launcher, *(p.pid for p in psutil.Process(launcher).children(recursive=True))]
    ours_before = resource.getrusage(resource.RUSAGE_SELF)
    agent_before = cpu_seconds(agent_side)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    profiler = cProfile.Profile()
    profiler.enable()
    started = time.perf_counter()
    seconds = await sandbox.download()
    wall = time.perf_counter() - started
    profiler.disable()
    ours_after = resource.getrusage(resource.RUSAGE_SELF)
    agent_after = cpu_seconds(agent_side)
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = (ours_after.ru_utime - ours_before.ru_utime) + (ours_after.ru_stime - ours_before.ru_stime)
    gone = ((children_after.ru_utime - children_before.ru_utime)
            + (children_after.ru_stime - children_before.ru_stime))
    print(f"\nprofile (host backend): client {seconds:.2f} s, call {wall:.2f} s wall")
    print(f"  CPU: this process (proxy, channel, tunnel) {ours:.2f} s; agent (live) "
          f"{agent_after - agent_before:.2f} s; exited children (the client, its shell) {gone:.2f} s")
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
    print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:4000])


async def sandboxes(args: argparse.Namespace) -> None:
    names = [n for n in args.backends.split(",") if n]
    with tempfile.TemporaryDirectory() as directory:
        blob = Path(directory) / "blob"
        blob.write_bytes(os.urandom(args.mb * 1024 * 1024))
        client = Path(directory) / "client.py"
        client.write_text(CLIENT)
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                                   str(port)], cwd=directory, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        opened: list[Sandbox] = []
        try:
            wait_listening(port)
            for name in names:
                sandbox = Sandbox(name, port)
                await sandbox.open()
                opened.append(sandbox)
            times: dict[str, list[float]] = {"direct (host)": [], **{s.name: [] for s in opened}}
            direct(port, client)  # warm-up: page cache, every path once
            for sandbox in opened:
                await sandbox.download()
            for _ in range(args.rounds):
                times["direct (host)"].append(await asyncio.to_thread(direct, port, client))
                for sandbox in opened:
                    times[sandbox.name].append(await sandbox.download())
            calls: dict[str, tuple[float, float, int]] = {}
            for sandbox in opened:
                calls[sandbox.name] = await sandbox.idle_and_busy(args.calls, args.blocks)
            if args.profile and opened and opened[0].name == "host":
                await profile_host(opened[0])
        finally:
            for sandbox in opened:
                await sandbox.close()
            server.terminate()
            server.wait()
    base = statistics.median(times["direct (host)"])
    print(f"\n{args.mb} MB by Python urllib from 127.0.0.1, median of {args.rounds} rounds "
          f"(load average {os.getloadavg()[0]:.1f})")
    print(f"{'way':<26}{'seconds':>9}{'MB/s':>9}{'vs direct':>11}")
    for name, samples in times.items():
        median = statistics.median(samples)
        way = name if name.startswith("direct") else f"tunnel from {name}"
        print(f"{way:<26}{median:>9.3f}{args.mb / median:>9.0f}{base / median:>10.2f}x")
    print(f"\nbash true, p50 of {args.calls * (args.blocks + 1)} calls idle vs "
          f"{args.calls * args.blocks} while a download loop runs in the sandbox "
          f"({args.blocks} blocks of each, alternating)")
    print(f"{'backend':<18}{'idle ms':>9}{'busy ms':>9}{'ratio':>8}{'downloads':>11}")
    for name, (idle, busy, downloads) in calls.items():
        print(f"{name:<18}{idle:>9.2f}{busy:>9.2f}{busy / idle:>7.2f}x{downloads:>11}")


# -- the proxy core alone (no sandbox), by curl ----------------------------------------------
async def curl(url: str, *extra: str) -> float:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--fail", "-o", os.devnull, *extra, url, env=env)
    if await process.wait() != 0:
        raise RuntimeError(f"curl {' '.join(extra)} {url} failed")
    return time.perf_counter() - started


async def core(args: argparse.Namespace) -> None:
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
    base = statistics.median(times["direct"])
    print(f"{args.mb} MB from 127.0.0.1 by curl, median of {args.rounds} rounds")
    print(f"{'way':<22}{'seconds':>9}{'MB/s':>9}{'vs direct':>11}")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:<22}{median:>9.3f}{args.mb / median:>9.0f}{base / median:>10.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=40, help="tool calls per block")
    parser.add_argument("--blocks", type=int, default=3,
                        help="blocks of calls during a download (between idle blocks)")
    parser.add_argument("--backends", default=",".join(
        n for n in ALL if n == "host" or os.environ.get("TOOLSEAM_IMAGE")))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--core", action="store_true", help="the proxy core alone, by curl")
    args = parser.parse_args()
    asyncio.run(core(args) if args.core else sandboxes(args))


if __name__ == "__main__":
    main()
