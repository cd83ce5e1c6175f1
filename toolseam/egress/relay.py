"""Relaying one connection's bytes: one HTTP request and its response, or a tunnel."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from . import http1, splice
from .audit import EgressEvent
from .masking import REFUSED_METHODS, Masker
from .placeholders import Placeholder, Scanner, Swapper
from .upstream import ProxyRefusal, Upstream, bad_gateway

_FLUSH_TIMEOUT_S = 5.0


class Connection:
    """One client connection's streams, for the idle watchdog and ``close()``."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writers = [writer]
        self.last = time.monotonic()
        self.ended_by: str | None = None
        # Once the client has bytes of an answer, an error can only end the connection.
        self.answered = False
        # The whole answer was relayed: an abort now (close()) cuts nothing.
        self.finished = False
        # A captured connection: the program speaks its own protocol, so a refusal is a close,
        # never an HTTP answer.
        self.raw = False
        self.done = asyncio.Event()
        self.on_abort: list[Callable[[], None]] = []  # relays the transports' abort cannot end

    def touch(self) -> None:
        self.last = time.monotonic()

    async def release(self) -> None:
        """Close every stream before the handler returns, so no transport outlives it (a TLS
        close left to finish later is a socket nobody owns once the loop ends)."""
        client, *upstreams = self.writers
        for stream in upstreams:  # the answer is in or the connection failed: nothing to flush
            if stream.transport is not None:
                stream.transport.abort()
        if client.transport is None:  # a TLS layer that failed took it: nothing left to close
            return
        if self.ended_by:
            client.transport.abort()
            return
        client.close()  # flushes what the client has not read yet
        try:
            async with asyncio.timeout(_FLUSH_TIMEOUT_S):
                await client.wait_closed()
        except (TimeoutError, OSError):
            client.transport.abort()

    def abort(self, why: str) -> None:
        if not self.finished:
            self.ended_by = self.ended_by or why
        for hook in list(self.on_abort):
            hook()
        for writer in self.writers:
            if writer.transport is not None:
                writer.transport.abort()


async def _reap(task: asyncio.Task[None]) -> None:
    """Stop a helper task; its error (the client went away) ends the connection as EOF would."""
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: not logged as "never retrieved"


async def forward(connection: Connection, event: EgressEvent,
                  reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: http1.Head,
                  request_line: str, upstream: Upstream,
                  credentials: tuple[tuple[str, str], ...],
                  placeholders: tuple[Placeholder, ...] = (), foreign: list[str] | None = None,
                  ) -> None:
    """One request upstream (credentials added, placeholders swapped), its response back, then
    the end. A placeholder bound to another host (``foreign``) in the request refuses it."""
    def up(n: int) -> None:
        event.bytes_up += n
        connection.touch()

    def down(n: int) -> None:
        event.bytes_down += n
        connection.touch()

    method = request_line.split(" ", 1)[0]
    foreign = foreign or []
    request_line = _swap_head(event, head, request_line, placeholders, foreign)
    secrets = [value for _, value in credentials] + [p.value for p in placeholders]
    masker = None
    if secrets:  # nothing the upstream answers may hand a credential back (masking.py)
        if method.upper() in REFUSED_METHODS:
            raise ProxyRefusal(405, f"{method} to a host with credentials",
                               f"toolseam egress: {method} is refused to {event.host}: it would "
                               "echo the request, credentials included\n")
        masker = Masker(secrets)
        head.remove("accept-encoding")
        head.headers.append(("Accept-Encoding", "identity"))
    head.start = f"{request_line} HTTP/1.1"
    head.drop_hop_by_hop()
    head.remove(*(name for name, _ in credentials))
    head.headers.extend(credentials)
    head.headers.append(("Connection", "close"))
    framing = http1.body_framing(head)
    data = head.encode()
    upstream.writer.write(data)
    up(len(data))
    body_filter = None
    if foreign or any("body" in p.where for p in placeholders):
        def refuse_body() -> None:
            event.allowed, event.status = False, 403
            connection.abort(f"a placeholder bound to another host in the body to {event.host}")
        body_filter = Swapper([(p.fake, p.value) for p in placeholders if "body" in p.where],
                              foreign, refuse_body)
    body = asyncio.create_task(http1.relay_body(reader, upstream.writer, framing, up, body_filter))
    try:
        while True:
            response = await http1.read_head(upstream.reader)
            if response is None:
                raise bad_gateway(event.host, event.port, "the upstream closed without a response")
            status_text = response.start.split(" ", 2)[1:2]
            status = int(status_text[0]) if status_text and status_text[0].isdigit() else 0
            if not 100 <= status < 600 or status == 101:
                raise bad_gateway(event.host, event.port, f"a bad status line {response.start[:60]!r}")
            if status >= 200:
                break
            data = response.encode()  # 100 Continue and friends pass as they are
            if masker is not None:
                data = masker.mask(data)
            connection.answered = True
            writer.write(data)
            down(len(data))
        event.status = status  # inside an intercepted tunnel: the answer, not the 200 to CONNECT
        response_framing = http1.body_framing(response, response_to=request_line.split(" ")[0],
                                              status=status)
        response.drop_hop_by_hop()
        response.headers.append(("Connection", "close"))
        if masker is not None:
            encoding = (response.get("content-encoding") or "identity").strip().lower()
            if encoding != "identity":
                raise bad_gateway(event.host, event.port, (
                    f"the upstream answered a request with credentials in Content-Encoding "
                    f"{encoding!r} despite Accept-Encoding: identity; its body cannot be "
                    "checked for the credential"))
        data = response.encode()
        if masker is not None:
            data = masker.mask(data)
        connection.answered = True
        writer.write(data)
        down(len(data))
        if (masker is None and response_framing != "chunked"
                and splice.can_splice(upstream.writer, writer)):
            # plain sockets both ends (egress's lane), nothing to read in the body: the kernel
            # moves it, exactly its Content-Length (or to the upstream's end)
            size = None if response_framing is None else int(response_framing)
            try:
                await splice.relay(upstream.reader, upstream.writer, writer, down, size,
                                   connection.on_abort)
            except splice.BodyEnded:
                raise http1.BadRequest("the body ended before its Content-Length") from None
        else:
            await http1.relay_body(upstream.reader, writer, response_framing, down, masker)
        connection.finished = True
        await writer.drain()
    finally:
        await _reap(body)

def _swap_head(event: EgressEvent, head: http1.Head, request_line: str,
               placeholders: tuple[Placeholder, ...], foreign: list[str]) -> str:
    """Placeholders bound to this host swapped in the header (and URL) configured; one bound
    elsewhere anywhere in the head refuses the request before a byte goes upstream."""
    text = request_line + "\n" + "\n".join(f"{k}: {v}" for k, v in head.headers)
    for fake in foreign:
        if fake in text:
            raise ProxyRefusal(403, f"a placeholder credential bound to another host was sent "
                               f"to {event.host}",
                               f"toolseam egress refused {event.host}: the request carries a "
                               "placeholder credential bound to another host\n")
    for p in placeholders:
        if "header" in p.where:
            head.headers = [(k, v.replace(p.fake, p.value) if k.lower() == p.header.lower()
                             else v) for k, v in head.headers]
        if "url" in p.where:
            request_line = request_line.replace(p.fake, p.value)
    return request_line


async def tunnel(connection: Connection, event: EgressEvent, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, upstream: Upstream, foreign: list[str] | None = None
                 ) -> None:
    """Bytes both ways until the upstream ends (the client's EOF only half-closes upstream).
    A placeholder bound to some host seen going up (in the clear) ends the connection before
    it is passed on; inside TLS it cannot be seen."""
    scanner = Scanner(foreign or [])

    def counter(upward: bool) -> splice.Counter:
        def count(n: int) -> None:
            if upward:
                event.bytes_up += n
            else:
                event.bytes_down += n
            connection.touch()
        return count

    async def pump(source: asyncio.StreamReader, source_side: asyncio.StreamWriter,
                   sink: asyncio.StreamWriter, upward: bool) -> None:
        if not (upward and scanner) and splice.can_splice(source_side, sink):
            # plain sockets both ends (egress's lane): the kernel moves the bytes
            await splice.relay(source, source_side, sink, counter(upward), None,
                               connection.on_abort)
            if sink.can_write_eof() and not sink.transport.is_closing():
                sink.write_eof()
            return
        while data := await source.read(http1.CHUNK):
            if upward and scanner and scanner.seen(data):
                event.allowed, event.status = False, 403
                connection.abort(f"a placeholder credential bound to another host was sent "
                                 f"to {event.host}")
                return
            sink.write(data)
            if upward:
                event.bytes_up += len(data)
            else:
                event.bytes_down += len(data)
            connection.touch()
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()

    upward = asyncio.create_task(pump(reader, writer, upstream.writer, True))
    try:
        await pump(upstream.reader, upstream.writer, writer, False)
    finally:
        await _reap(upward)
