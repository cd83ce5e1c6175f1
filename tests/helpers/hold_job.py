"""Opens a container backend, starts a long job, prints the container id, then waits to be killed."""

from __future__ import annotations

import asyncio
import json
import sys

from toolseam.seam.models import SpawnRequest

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))

from tests.engines import backend


async def main(engine: str, workspace: str, marker: str) -> None:
    sandbox = backend(engine, workspace)
    await sandbox.open()
    await sandbox.start(SpawnRequest(job="held", argv=["/bin/sh", "-c", f"sleep {marker}"],
                                     cwd="/workspace", env={"PATH": "/usr/bin:/bin"},
                                     deadline_ms=5000, wait_ms=0))
    print(json.dumps({"container": sandbox.sandbox.container}), flush=True)  # type: ignore[attr-defined]
    await asyncio.sleep(3600)


asyncio.run(main(*sys.argv[1:4]))
