"""Exec latency through the OpenAI Agents SDK's sandbox interface: toolseam's provider against
the SDK's own ``unix_local`` and ``docker`` clients, in one run (docs/benchmarks.md).

    python benchmarks/openai_agents.py                  # host: toolseam vs unix_local
    python benchmarks/openai_agents.py --containers     # + podman, rootless podman, docker,
                                                        #   and the SDK's docker client

Per client: one session is created and started, then N times ``session.exec("true")`` (the
SDK's ``sh -lc true``) and a 4 KiB ``write`` + ``read`` are timed. Figures are p50 / p90 in ms
of the samples, one event loop; create + start is timed once per client. The SDK's docker
client needs ``tail`` in the image (the project's test image has it) and runs every command as
a docker ``exec``.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.sandbox.manifest import Manifest

from toolseam.integrations.openai_agents import (
    ToolseamSandboxClient,
    ToolseamSandboxClientOptions,
)


def _clients(containers: bool) -> list[tuple[str, Any, Any]]:
    from agents.sandbox.sandboxes.unix_local import UnixLocalSandboxClient

    made: list[tuple[str, Any, Any]] = [
        ("toolseam host", ToolseamSandboxClient(), ToolseamSandboxClientOptions()),
        ("SDK unix_local", UnixLocalSandboxClient(), None),
    ]
    if not containers:
        return made
    import docker
    from agents.sandbox.sandboxes.docker import DockerSandboxClient, DockerSandboxClientOptions

    from tests import engines
    for engine in engines.ENGINES:
        backend_options: dict[str, Any] = {"image": engines.IMAGE,
                                           "endpoint": engines.endpoint(engine)}
        if engine == "podman-rootless":
            backend_options["rootless"] = True
        made.append((f"toolseam {engine}", ToolseamSandboxClient(), ToolseamSandboxClientOptions(
            backend="docker" if engine == "docker" else "podman",
            backend_options=backend_options)))
    sdk_docker = DockerSandboxClient(docker.DockerClient(base_url=engines.endpoint("docker")))
    made.append(("SDK docker", sdk_docker,
                 DockerSandboxClientOptions(image=engines.IMAGE, network_mode="none")))
    return made


async def _timed(rounds: int, step: Callable[[], Awaitable[Any]]) -> list[float]:
    samples = []
    for _ in range(rounds):
        began = time.perf_counter()
        await step()
        samples.append((time.perf_counter() - began) * 1000)
    return samples


def _p(samples: list[float], q: int) -> str:
    return f"{statistics.quantiles(samples, n=10)[q // 10 - 1]:.1f}" if q != 50 else \
        f"{statistics.median(samples):.1f}"


async def measure(name: str, client: Any, options: Any, rounds: int) -> str:
    began = time.perf_counter()
    session = await client.create(manifest=Manifest(), options=options)
    await session.start()
    opened = (time.perf_counter() - began) * 1000
    payload = b"x" * 4096
    try:
        await session.exec("true")  # warm-up
        execs = await _timed(rounds, lambda: session.exec("true"))

        async def round_trip() -> None:
            await session.write(Path("bench.bin"), io.BytesIO(payload))
            assert (await session.read(Path("bench.bin"))).read() == payload

        files = await _timed(rounds, round_trip)
    finally:
        await session.aclose()
        await client.delete(session)
    return (f"| {name} | {_p(execs, 50)} | {_p(execs, 90)} | {_p(files, 50)} | "
            f"{_p(files, 90)} | {opened:.0f} |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--containers", action="store_true")
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    print("| client | exec `true` p50 ms | p90 | 4 KiB write+read p50 ms | p90 | "
          "create+start ms |")
    print("|---|---|---|---|---|---|")
    for name, client, options in _clients(args.containers):
        print(await measure(name, client, options, args.rounds), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
