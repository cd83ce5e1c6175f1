"""Exec latency through toolseam's framework providers against each framework's own local one:
deepagents' ``execute("true")`` (``ToolseamSandbox`` vs ``LocalShellBackend``) and pydantic-ai's
``run(["true"])`` (``ToolseamWorkspace`` vs ``LocalWorkspaceBackend``), p50, on each backend.

    set -a; . ./.engines.env; set +a       # engine endpoints (scripts/setup-engines.sh)
    python benchmarks/providers.py [--calls 300]

All sandboxes are open at once and measured in alternating blocks of 10 calls
(``bench.interleaved``), so a loaded machine's drift hits every contender alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import interleaved
from deepagents.backends.local_shell import LocalShellBackend
from pydantic_ai.workspaces import LocalWorkspaceBackend

from toolseam.integrations.deepagents import ToolseamSandbox
from toolseam.integrations.pydantic_ai import ToolseamWorkspace

IMAGE = os.environ.get("TOOLSEAM_IMAGE", "localhost/toolseam-sandbox:latest")


def engines(shared: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """The toolseam backends measured: name -> (backend, provider options)."""
    def engine(variable: str, **more: Any) -> dict[str, Any]:
        return {"image": IMAGE, "backend_options": {"endpoint": os.environ[variable], **more}}

    found: dict[str, tuple[str, dict[str, Any]]] = {"host": ("host", {})}
    if os.environ.get("TOOLSEAM_PODMAN_URL"):
        found["podman"] = ("podman", engine("TOOLSEAM_PODMAN_URL"))
    if os.environ.get("TOOLSEAM_PODMAN_ROOTLESS_URL"):  # its user must reach the workspace
        found["podman rootless"] = ("podman", {**engine("TOOLSEAM_PODMAN_ROOTLESS_URL",
                                                        rootless=True), "workspace": shared})
    if os.environ.get("TOOLSEAM_DOCKER_URL"):
        found["docker"] = ("docker", engine("TOOLSEAM_DOCKER_URL"))
    return found


def table(title: str, figures: dict[str, float], calls: int) -> None:
    local = next(iter(figures.values()))
    print(f"| {title} p50, {calls} calls | ms | vs local |")
    print("|---|---:|---:|")
    for name, ms in figures.items():  # bench.p50 answers milliseconds
        print(f"| {name} | {ms:.2f} | {ms / local:.2f}x |")
    print()


async def deepagents_table(calls: int, shared: str, local_dir: str) -> None:
    sandboxes: dict[str, Any] = {"LocalShellBackend (deepagents)": LocalShellBackend(
        root_dir=local_dir, virtual_mode=False)}
    try:
        for name, (backend, options) in engines(shared).items():
            sandboxes[f"toolseam {name}"] = ToolseamSandbox(backend, **options)
        figures = await interleaved({name: lambda s=sandbox: s.execute("true")
                                     for name, sandbox in sandboxes.items()}, calls)
    finally:
        for sandbox in sandboxes.values():
            if isinstance(sandbox, ToolseamSandbox):
                sandbox.delete()
    table('deepagents `execute("true")`', figures, calls)


async def pydantic_ai_table(calls: int, shared: str, local_dir: str, store: str) -> None:
    workspaces: dict[str, Any] = {"LocalWorkspaceBackend (pydantic-ai)":
                                  LocalWorkspaceBackend(local_dir)}
    try:
        for name, (backend, options) in engines(shared).items():
            workspaces[f"toolseam {name}"] = ToolseamWorkspace(backend, secret_store=store,
                                                               **options)
        for workspace in workspaces.values():
            assert (await workspace.run(["true"])).exit_code == 0
        figures = await interleaved({name: lambda w=workspace: w.run(["true"])
                                     for name, workspace in workspaces.items()}, calls)
    finally:
        for workspace in workspaces.values():
            if isinstance(workspace, ToolseamWorkspace):
                await workspace.destroy()
    table('pydantic-ai `run(["true"])`', figures, calls)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    shared = tempfile.mkdtemp(prefix="toolseam-bench-")
    os.chmod(shared, 0o777)  # the rootless engine's user works in it
    local_dir = tempfile.mkdtemp(prefix="toolseam-bench-local-")
    store = tempfile.mkdtemp(prefix="toolseam-bench-secrets-")
    try:
        await deepagents_table(args.calls, shared, local_dir)
        await pydantic_ai_table(args.calls, shared, local_dir, store)
    finally:
        for path in (shared, local_dir, store):
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
