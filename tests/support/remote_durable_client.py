"""A client of a remote server that opens a durable session, prints its handle, starts a call
and waits to be killed (tests/host/test_remote_durable.py).

``remote_durable_client.py SERVER_DIR WORKSPACE ORPHAN_S TAG``: the session hosts the host
backend in WORKSPACE; the command prints numbered lines for a few seconds in the foreground of
a call (in flight when the test kills this process), with TAG in its command line so a test
finds exactly its own processes. The handle is the first line on stdout, ``started`` the
second.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from toolseam import Toolkit
from toolseam.backends.remote import HostedSpec, RemoteBackend, UnixTransport
from toolseam.seam.lifetime import Durable

COMMAND = "for i in $(seq 1 15); do echo line-$i; sleep 0.1; done; echo done"


async def main(server: str, workspace: str, orphan_s: str, tag: str) -> None:
    backend = RemoteBackend(transport=UnixTransport(server),
                            hosted=HostedSpec(kind="host", options={"workspace": workspace}),
                            lifetime=Durable(orphan_timeout_s=float(orphan_s)))
    tk = Toolkit(backend, settings={"timeout_policy": "detach", "default_timeout_ms": 60_000})
    await tk.open()
    await tk.call("write", {"path": "before.txt", "content": "made before the kill\n"})
    print(tk.handle.to_json(), flush=True)
    call = asyncio.ensure_future(tk.call("bash", {"command": f": {tag}; {COMMAND}"}))
    await asyncio.sleep(0.5)
    print("started", flush=True)
    await call
    await asyncio.sleep(3600)


asyncio.run(main(*sys.argv[1:5]))
