"""inspect_ai's ``sandbox.exec(["true"])``, p50, through the ``toolseam`` provider on each
backend, against inspect's own ``local`` provider (and its ``docker`` provider when the docker
compose plugin it drives is installed).

    set -a; . ./.engines.env; set +a       # engine endpoints (scripts/setup-engines.sh)
    python benchmarks/inspect_exec.py [--calls 300]

Each sandbox is made through the provider's ``sample_init`` and removed by ``sample_cleanup``,
as an eval would; all are open at once and measured in alternating blocks of 10 calls
(``bench.interleaved``), so a loaded machine's drift hits every contender alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import interleaved
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.local import LocalSandboxEnvironment

from toolseam.frontends.inspect import ToolseamSandboxConfig, ToolseamSandboxEnvironment

IMAGE = os.environ.get("TOOLSEAM_IMAGE", "localhost/toolseam-sandbox:latest")
CONTENDERS: dict[str, tuple[type[SandboxEnvironment], Any]] = {
    "local (inspect)": (LocalSandboxEnvironment, None),
    "toolseam host": (ToolseamSandboxEnvironment, ToolseamSandboxConfig(backend="host")),
    "toolseam podman": (ToolseamSandboxEnvironment,
                        ToolseamSandboxConfig(backend="podman", image=IMAGE)),
    "toolseam podman rootless": (ToolseamSandboxEnvironment,
                                 ToolseamSandboxConfig(backend="podman", rootless=True, image=IMAGE)),
    "toolseam docker": (ToolseamSandboxEnvironment,
                        ToolseamSandboxConfig(backend="docker", image=IMAGE)),
}


def compose_plugin() -> bool:
    if shutil.which("docker") is None:
        return False
    done = subprocess.run(["docker", "compose", "version"], capture_output=True)
    return done.returncode == 0


async def open_all(contenders: dict[str, tuple[type[SandboxEnvironment], Any]]
                   ) -> dict[str, tuple[type[SandboxEnvironment], Any, dict[str, SandboxEnvironment]]]:
    opened = {}
    for name, (provider, config) in contenders.items():
        envs = await provider.sample_init("bench", config, {})
        assert (await envs["default"].exec(["true"])).success
        opened[name] = (provider, config, envs)
    return opened


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    contenders = dict(CONTENDERS)
    if compose_plugin():
        from inspect_ai.util._sandbox.docker.docker import DockerSandboxEnvironment

        contenders["docker (inspect)"] = (DockerSandboxEnvironment, None)
    else:
        print("inspect's docker provider: not measured — the docker compose plugin it drives "
              "is not installed here\n")
    opened = await open_all(contenders)
    try:  # alternating blocks: every contender sees the same load drift (bench.interleaved)
        figures = await interleaved({name: lambda e=envs: e["default"].exec(["true"])
                                     for name, (_, _, envs) in opened.items()}, args.calls)
    finally:
        for provider, config, envs in opened.values():
            await provider.sample_cleanup("bench", config, envs, False)
    local = figures["local (inspect)"]
    print(f"| exec([\"true\"]) p50, {args.calls} calls | ms | vs local |")
    print("|---|---:|---:|")
    for name, ms in figures.items():
        print(f"| {name} | {ms:.2f} | {ms / local:.2f}x |")


if __name__ == "__main__":
    asyncio.run(main())
