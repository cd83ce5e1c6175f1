"""Opens a container backend, starts a long job, prints the container id, then waits to be killed."""

from __future__ import annotations

import asyncio
import json
import sys

from toolseam.backends.host import HostBackend
from toolseam.seam.models import SpawnRequest

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))

from tests.support.engines import backend


async def main(engine: str, workspace: str, marker: str) -> None:
    sandbox = HostBackend(workspace) if engine == "host" else backend(engine, workspace)
    await sandbox.open()
    cwd = workspace if engine == "host" else "/workspace"
    await sandbox.start(SpawnRequest(job="held", argv=["/bin/sh", "-c", f"sleep {marker}"], cwd=cwd,
                                     env={"PATH": "/usr/bin:/bin"}, deadline_ms=5000, wait_ms=0))
    held = getattr(getattr(sandbox, "sandbox", None), "container", None)
    print(json.dumps({"container": held}), flush=True)
    await asyncio.sleep(3600)


asyncio.run(main(*sys.argv[1:4]))
