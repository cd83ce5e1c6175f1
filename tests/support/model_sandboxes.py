"""Where model-facing tests run (the host and one engine, docker) and the sandbox they open there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toolseam import Settings, Toolkit, ToolResult

from .engines import backend, shared_dir

WHERE = ["host", "docker"]


class Sandbox:
    def __init__(self, tk: Toolkit, work: Path) -> None:
        self.tk = tk
        self.work = work

    async def call(self, tool: str, **args: Any) -> ToolResult:
        return await self.tk.call(tool, args)

    def put(self, rel: str, data: bytes, mode: int = 0o666) -> Path:
        path = self.work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(mode)
        return path


async def open_sandbox(where: str, settings: Settings | None = None
                       ) -> tuple[Toolkit, Path]:
    work = shared_dir()
    chosen = "host" if where == "host" else backend(where, str(work))
    tk = Toolkit(chosen, base_dir=str(work) if where == "host" else "/workspace",
                 confine_to_base_dir=True, settings=settings)
    await tk.open()
    return tk, work
