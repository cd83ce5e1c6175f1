"""Engines that share no filesystem (copy mode) next to the same engines' local sockets.

Endpoints from .engines.env (scripts/setup-engines.sh → setup-remote-engines.sh): docker over
TCP with TLS, podman's API service over TCP; the local docker and podman sockets for the same
engines' bind-mode figures. Every figure is a p50 from this run.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import row, time_async

from toolseam import Toolkit
from toolseam.backends.containers.engine.attach import TlsFiles
from toolseam.backends.docker import DockerBackend
from toolseam.backends.podman import PodmanBackend

LOCAL_IMAGE = os.environ.get("TOOLSEAM_IMAGE", "localhost/toolseam-sandbox:latest")
REMOTE_IMAGE = os.environ.get("TOOLSEAM_REMOTE_IMAGE", "127.0.0.1:5443/toolseam/sandbox:latest")
SETUPS = ("docker socket", "docker TCP+TLS", "podman socket", "podman TCP")


def _backend(setup: str, workspace: str) -> Any:
    if setup == "docker socket":
        return DockerBackend(workspace, image=LOCAL_IMAGE)
    if setup == "podman socket":
        return PodmanBackend(workspace, image=LOCAL_IMAGE)
    if setup == "docker TCP+TLS":
        return DockerBackend(workspace, image=REMOTE_IMAGE,
                             endpoint=os.environ["TOOLSEAM_REMOTE_DOCKER_URL"],
                             tls=TlsFiles.from_dir(os.environ["TOOLSEAM_REMOTE_DOCKER_CERT_PATH"]))
    return PodmanBackend(workspace, image=REMOTE_IMAGE,
                         endpoint=os.environ["TOOLSEAM_REMOTE_PODMAN_URL"])


def _fill(root: Path, files: int, size: int) -> None:
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o777)
    chunk = os.urandom(size)
    for i in range(files):
        (root / f"f{i:05d}.bin").write_bytes(chunk)


async def _open_time(setup: str, workspace: str) -> float:
    samples = []
    for _ in range(3):
        started = time.perf_counter()
        tk = Toolkit(_backend(setup, workspace))
        await tk.call("bash", {"command": "true"})
        samples.append(time.perf_counter() - started)
        await tk.close()
    return sorted(samples)[1] * 1000


async def _copy_back(setup: str, workspace: str) -> float | None:
    """sync() after the sandbox changed 1 000 files (1 KiB each); None in bind mode (shared)."""
    samples = []
    for _ in range(3):
        made = _backend(setup, workspace)
        if made.workspace_mode == "bind":
            return None
        async with Toolkit(made) as tk:
            await tk.call("bash", {"command": "for i in $(seq 1000); do head -c 1024 /dev/urandom"
                                   " > changed-$i.txt; done", "timeout": 120_000})
            started = time.perf_counter()
            report = await tk.sync()
            samples.append(time.perf_counter() - started)
            assert len(report.added) + len(report.modified) == 1000, report
            await tk.call("bash", {"command": "rm changed-*"})
    return sorted(samples)[1] * 1000


async def remote_table() -> list[str]:
    with tempfile.TemporaryDirectory(prefix="toolseam-bench-remote-") as root:
        os.chmod(root, 0o777)
        small, mb1, mb100 = Path(root, "small"), Path(root, "1mb"), Path(root, "100mb")
        _fill(small, 1, 100)
        (small / "small.txt").write_text("hello\n" * 20)
        _fill(mb1, 16, 64 << 10)  # 1 MiB in 16 files
        _fill(mb100, 100, 1 << 20)  # 100 MiB in 100 files
        figures: dict[str, dict[str, float | None]] = {}
        for setup in SETUPS:
            f: dict[str, float | None] = {}
            async with Toolkit(_backend(setup, str(small))) as tk:
                f["bash true"] = await time_async(lambda tk=tk: tk.call("bash", {"command": "true"}), 200)
                f["read small"] = await time_async(
                    lambda tk=tk: tk.call("read", {"path": "small.txt"}), 300)
            f["open, 1 MiB workspace"] = await _open_time(setup, str(mb1))
            f["open, 100 MiB workspace"] = await _open_time(setup, str(mb100))
            f["sync, 1 000 changed files"] = await _copy_back(setup, str(small))
            figures[setup] = f
    out = [row("p50 ms", *SETUPS), "|" + "|".join(["-" * 28] + ["-" * 14] * len(SETUPS)) + "|"]
    for metric in figures[SETUPS[0]]:
        out.append(row(metric, *("— (shared)" if figures[s][metric] is None
                                 else f"{figures[s][metric]:.2f}" for s in SETUPS)))
    def ratio(remote: str, local: str) -> str:
        return f"{(figures[remote]['bash true'] or 0) / (figures[local]['bash true'] or 1):.2f}x"

    out.append(row("  bash: TCP / socket", "", ratio("docker TCP+TLS", "docker socket"), "",
                   ratio("podman TCP", "podman socket")))
    return out
