"""A client that opens a durable session, prints its handle, starts a call and is then killed.

``durable_client.py ENGINE WORKSPACE FORM ORPHAN_S [TAG]``: FORM ``long`` runs a command that prints
numbered lines for a few seconds in the foreground (the call is in flight when the test kills
this process); ``stream`` does the same with live output to this process; ``idle`` starts
nothing. The handle is the first line on stdout, ``started`` the second once output flows.
TAG, when given, is put in the command line (a no-op ``:``) so a test can look for exactly its
own command among the machine's processes (tests on other workers run the same command).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.engines import backend
from toolseam import Toolkit
from toolseam.seam.lifetime import Durable

COMMAND = "for i in $(seq 1 40); do echo line-$i; sleep 0.1; done; echo done"


async def main(engine: str, workspace: str, form: str, orphan_s: str, tag: str = "") -> None:
    chosen = "host" if engine == "host" else backend(
        engine, workspace, lifetime=Durable(orphan_timeout_s=float(orphan_s)))
    tk = Toolkit(chosen, base_dir=workspace if engine == "host" else None,
                 settings={"orphan_timeout_s": float(orphan_s), "timeout_policy": "detach",
                           "default_timeout_ms": 60_000})
    await tk.open()
    await tk.call("write", {"path": "before.txt", "content": "made before the kill\n"})
    print(tk.handle.to_json(), flush=True)
    if form == "idle":
        await asyncio.sleep(3600)
    started = asyncio.Event()

    def seen(_event: object) -> None:
        if not started.is_set():
            started.set()
            print("started", flush=True)

    command = f": {tag}; {COMMAND}" if tag else COMMAND
    call = asyncio.ensure_future(tk.call("bash", {"command": command},
                                         on_output=seen if form == "stream" else None))
    if form != "stream":
        await asyncio.sleep(0.5)
        print("started", flush=True)
    await call
    await asyncio.sleep(3600)


asyncio.run(main(*sys.argv[1:6]))
