"""Leaving a pool while its refill starts, and the rootless workspace check (issue 33, item 7;
decisions 221, 222).

    python benchmarks/pool_close.py [--rounds 8] [--engines podman,podman-rootless]

Per engine: a ``SandboxPool`` of one is started and closed after a delay spread over the first
second (the window in which its sandbox is being created, started and greeted); the close
times' median and maximum. Then the cost of ``check_workspace_access`` as root for the rootless
engine's user (a fork per open), mean of 50.

Needs ``set -a; . .engines.env; set +a`` (scripts/setup-engines.sh) and root for the check.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pwd
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from toolseam import SandboxPool  # noqa: E402
from toolseam.backends.containers.modes.workspace_access import check_workspace_access  # noqa: E402
from toolseam.backends.podman import PodmanBackend  # noqa: E402

IMAGE = os.environ.get("TOOLSEAM_IMAGE", "localhost/toolseam-sandbox:latest")


async def close_times(rootless: bool, rounds: int) -> list[float]:
    took = []
    for i in range(rounds):
        pool = SandboxPool(PodmanBackend, size=1, image=IMAGE, rootless=rootless)
        await pool.start()
        await asyncio.sleep(i / max(1, rounds - 1))  # 0 … 1 s into the refill
        began = time.monotonic()
        await pool.close()
        took.append(time.monotonic() - began)
    return took


def check_cost(user: str, calls: int = 50) -> float:
    uid = pwd.getpwnam(user).pw_uid
    with tempfile.TemporaryDirectory() as where:
        os.chmod(where, 0o777)
        began = time.perf_counter()
        for _ in range(calls):
            check_workspace_access(where, uid, "podman-rootless")
        return (time.perf_counter() - began) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--engines", default="podman,podman-rootless")
    args = parser.parse_args()
    for engine in args.engines.split(","):
        took = asyncio.run(close_times(engine == "podman-rootless", args.rounds))
        print(f"{engine}: pool close during a refill, median {statistics.median(took):.2f} s, "
              f"max {max(took):.2f} s ({args.rounds} rounds)")
    user = os.environ.get("TOOLSEAM_ROOTLESS_USER")
    if user and os.geteuid() == 0:
        print(f"check_workspace_access as root for {user}: {check_cost(user) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
