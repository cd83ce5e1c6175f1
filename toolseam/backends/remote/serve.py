"""``python -m toolseam.backends.remote.serve DIRECTORY``: a remote server for this user's
clients on ``DIRECTORY/socket`` (made 0700 if missing), until SIGTERM or SIGINT. A client is
``RemoteBackend(transport=UnixTransport(DIRECTORY), hosted=HostedSpec(kind=…, options=…))``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from .server import RemoteServer
from .unix import UnixListener


async def serve(directory: Path) -> None:
    spool = directory / "spool"
    listener = UnixListener(RemoteServer(str(spool)), directory)
    spool.mkdir(mode=0o700, exist_ok=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await listener.start()
    try:
        await stop.wait()
    finally:
        await listener.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m toolseam.backends.remote.serve",
                                     description="Host this user's remote sessions.")
    parser.add_argument("directory", type=Path, help="where the socket and its key are made")
    asyncio.run(serve(parser.parse_args(argv).directory))


if __name__ == "__main__":
    main()
