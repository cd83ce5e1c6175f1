"""Relaying bytes between two plain sockets inside the kernel (``splice(2)`` through a pipe):
where egress's lane hands the proxy the sandbox client's own socket, a download's bytes go from
the upstream's socket to the client's without entering Python — the two Python copies per byte
were what held the proxy to half the direct rate (docs/benchmarks.md).

Only between plain sockets: a TLS layer (an intercepted host), a connection carried as frames
(a remote engine) or a body that must be read (masking, placeholders) keeps the stream copy.
Why by hand: asyncio has ``sendfile`` (file to socket) but nothing socket to socket, and no
well-kept library does it on an asyncio loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import socket
import threading
from collections.abc import Callable

PIPE_SIZE = 1 << 20  # bytes in flight in the kernel per direction (the pipe's capacity)
_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
_DRAIN_WAIT_S = 0.001
_NICE = 10  # the relay threads' CPU priority: below the loop's, the agent's and commands'
Counter = Callable[[int], None]


class BodyEnded(Exception):
    """The source ended before the size it declared."""


def plain_fd(writer: asyncio.StreamWriter) -> int | None:
    """The descriptor of a stream's socket when nothing but the kernel stands between (no TLS
    layer, a real socket transport); else None."""
    transport = writer.transport
    if transport is None or transport.is_closing():
        return None
    if transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None or sock.type != socket.SOCK_STREAM:
        return None
    return int(sock.fileno())


def can_splice(source_side: asyncio.StreamWriter, sink: asyncio.StreamWriter) -> bool:
    return plain_fd(source_side) is not None and plain_fd(sink) is not None


async def relay(source: asyncio.StreamReader, source_side: asyncio.StreamWriter,
                sink: asyncio.StreamWriter, count: Counter, size: int | None,
                on_abort: list[Callable[[], None]]) -> None:
    """``size`` bytes (None: until the source's EOF) from ``source`` (read through its stream
    ``source_side``'s socket) to ``sink``, in the kernel. What the stream reader holds already
    goes first. ``on_abort`` gets a hook that shuts both sockets, so the connection's abort
    ends the relay (it works on duplicates the transports' close would not end). Raises
    ``BodyEnded`` when the source ends short of ``size``; OSError when a socket fails."""
    src, dst = plain_fd(source_side), plain_fd(sink)
    assert src is not None and dst is not None, "can_splice first"
    source_transport = source_side.transport
    assert isinstance(source_transport, asyncio.ReadTransport)
    source_transport.pause_reading()  # from here on only the kernel reads it
    remaining = await _held_first(source, sink, count, size)
    if remaining == 0:
        return
    if source.at_eof():
        if remaining:
            raise BodyEnded(f"{remaining} bytes short")
        return
    await _drained(sink)
    # Duplicates the relay owns: the transports' own close does not end what a duplicate
    # holds, so an abort shuts the sockets themselves (the peers see the end too).
    # The thread closes them itself when it is done: closed from the loop instead, they leaked
    # (a ResourceWarning from the finishing thread) whenever the loop had closed before the
    # thread's end reached it — at a test's or a session's end (issue 45). The lock keeps a
    # shutdown from meeting a close half-way (a descriptor number reused meanwhile).
    ends = (socket.socket(fileno=os.dup(src)), socket.socket(fileno=os.dup(dst)))
    ends_lock = threading.Lock()

    def shut() -> None:
        with ends_lock:
            for end in ends:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    loop = asyncio.get_running_loop()
    moved: asyncio.Future[int | None] = loop.create_future()
    # a relay cancelled meanwhile (its connection aborted) no longer awaits the outcome: its
    # failure (a reset peer) is then retrieved here, not logged as "never retrieved"
    moved.add_done_callback(lambda done: done.cancelled() or done.exception())

    def settle(outcome: int | BaseException | None) -> None:
        if not moved.done():
            if isinstance(outcome, BaseException):
                moved.set_exception(outcome)
            else:
                moved.set_result(outcome)

    def run() -> None:
        outcome: int | BaseException | None
        try:
            outcome = _move(ends[0].fileno(), ends[1].fileno(), remaining, count)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            outcome = exc
        with ends_lock:  # done with them
            for end in ends:
                end.close()
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, outcome)

    on_abort.append(shut)
    # A thread, not the loop: a splice to a loopback socket runs the receiver's side in the
    # caller's syscall, long enough to hold up a tool call's answer on a busy machine; and at
    # a lower priority, so a download yields the CPU to calls (as the agent's tunnel threads do).
    threading.Thread(target=run, daemon=True, name="egress-splice").start()
    try:
        remaining = await asyncio.shield(moved)
    except asyncio.CancelledError:
        shut()  # the thread sees the end and stops
        raise
    finally:
        with contextlib.suppress(ValueError):
            on_abort.remove(shut)
    if remaining:
        raise BodyEnded(f"{remaining} bytes short")


def _move(src: int, dst: int, remaining: int | None, count: Counter) -> int | None:
    """The relay's thread: source to pipe to sink until the end or ``remaining`` is 0."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _NICE)
    pipe_r, pipe_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        with contextlib.suppress(OSError):  # a smaller pipe works, only slower
            fcntl.fcntl(pipe_w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        while remaining is None or remaining > 0:
            want = PIPE_SIZE if remaining is None else min(PIPE_SIZE, remaining)
            try:
                got = os.splice(src, pipe_w, want, flags=_FLAGS)
            except BlockingIOError:
                _wait(src, select.POLLIN)
                continue
            if got == 0:
                break
            while got:
                try:
                    moved = os.splice(pipe_r, dst, got, flags=_FLAGS)
                except BlockingIOError:
                    _wait(dst, select.POLLOUT)
                    continue
                got -= moved
                count(moved)  # plain attribute updates: safe from a thread under the GIL
                if remaining is not None:
                    remaining -= moved
    finally:
        os.close(pipe_r)
        os.close(pipe_w)
    return remaining


def _wait(fd: int, event: int) -> None:
    """Until ``fd`` is ready, or shut (an abort: the next splice then ends or fails)."""
    poller = select.poll()
    poller.register(fd, event)
    poller.poll()


async def _held_first(source: asyncio.StreamReader, sink: asyncio.StreamWriter, count: Counter,
                      size: int | None) -> int | None:
    """What the stream reader read ahead, to the sink; the size left. ``_buffer`` is private:
    StreamReader has no public way to take what it holds without waiting for more."""
    error = source.exception()
    if error is not None:
        raise error
    buffered: bytearray = getattr(source, "_buffer")  # noqa: B009 - private, see the docstring
    take = len(buffered) if size is None else min(size, len(buffered))
    if take:
        held = bytes(buffered[:take])
        del buffered[:take]
        sink.write(held)
        count(take)
        await sink.drain()
    return None if size is None else size - take


async def _drained(sink: asyncio.StreamWriter) -> None:
    """The sink's transport has written everything it queued (splice writes behind it); a
    client that never reads is ended by the idle watchdog, which closes the transport."""
    transport = sink.transport
    while transport.get_write_buffer_size():
        if transport.is_closing():
            raise ConnectionResetError("the connection was closed")
        await sink.drain()
        await asyncio.sleep(_DRAIN_WAIT_S)
