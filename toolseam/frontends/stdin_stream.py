"""Standard input as an asyncio stream, whatever it is.

A pipe, a socket or a terminal is watched by the event loop. A regular file (``toolseam serve
--stdio < requests.jsonl``) or ``/dev/null`` cannot be: ``connect_read_pipe`` refuses a file
("Pipe transport is for pipes/sockets only") and epoll refuses ``/dev/null`` (EPERM, raised in
a callback, so the server waited forever). For those a thread copies stdin into a pipe the
loop watches; the pipe's buffer holds the thread back while the reader is behind, so a large
file is never read into memory ahead of the requests.
"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import threading

__all__ = ["connect_stdin"]


def _watchable(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


def _copy(source: int, sink: int) -> None:
    try:
        while data := os.read(source, 1 << 16):
            view = memoryview(data)
            while view:
                view = view[os.write(sink, view):]
    except OSError:
        pass  # the server stopped reading (its pipe end closed): nothing waits for the rest
    finally:
        os.close(sink)


async def connect_stdin(reader: asyncio.StreamReader) -> None:
    """Feed ``reader`` from this process's standard input until EOF."""
    loop = asyncio.get_running_loop()
    fd = sys.stdin.fileno()
    if _watchable(fd):
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        return
    read_end, write_end = os.pipe()
    threading.Thread(target=_copy, args=(fd, write_end), name="toolseam-stdin", daemon=True).start()
    pipe = os.fdopen(read_end, "rb", buffering=0)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
