"""The slice of HTTP/1.1 a forward proxy needs: read a head, rewrite its headers, relay a body.

Bodies are relayed in their own framing (``Content-Length`` bytes, or chunked as chunked), so a
request ends exactly where the client meant it to, and whatever the client sends after it is
never forwarded to that upstream.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

MAX_HEAD = 64 * 1024
CHUNK = 256 * 1024

# RFC 9110 §7.6.1 plus the proxy-only ones; Transfer-Encoding is kept because bodies are relayed
# in their own framing.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
                        "proxy-authorization", "te", "trailer", "upgrade"})


class BadRequest(ValueError):
    """The client's bytes are not an HTTP/1.x request this proxy serves."""


@dataclass
class Head:
    """A request or status line and its headers, in order, with names as sent."""

    start: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    def get(self, name: str) -> str | None:
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value
        return None

    def remove(self, *names: str) -> None:
        lowered = {name.lower() for name in names}
        self.headers = [(k, v) for k, v in self.headers if k.lower() not in lowered]

    def drop_hop_by_hop(self) -> None:
        named = {token.strip().lower() for value in
                 (v for k, v in self.headers if k.lower() == "connection")
                 for token in value.split(",")}
        # Connection may not name the framing headers away.
        named -= {"content-length", "transfer-encoding", "host"}
        self.remove(*HOP_BY_HOP, *named)

    def encode(self) -> bytes:
        lines = [self.start, *(f"{k}: {v}" for k, v in self.headers), "", ""]
        return "\r\n".join(lines).encode("latin-1")


async def read_head(reader: asyncio.StreamReader) -> Head | None:
    """The next head, or None at a clean EOF before any byte."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as error:
        if not error.partial.strip():
            return None
        raise BadRequest("the connection ended inside a request head") from None
    except asyncio.LimitOverrunError:
        raise BadRequest(f"a request head longer than {MAX_HEAD} bytes") from None
    text = raw.decode("latin-1")
    lines = text.split("\r\n")[:-2]
    if not lines or not lines[0]:
        raise BadRequest("an empty request line")
    head = Head(lines[0])
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            raise BadRequest("folded header lines are not accepted")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(f"a malformed header line {line[:80]!r}")
        head.headers.append((name, value.strip()))
    return head


def body_framing(head: Head, *, response_to: str | None = None, status: int = 0) -> str | int | None:
    """``"chunked"``, a byte count, or None for "until EOF" (responses only)."""
    if response_to == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return 0
    encoding = head.get("transfer-encoding")
    if encoding is not None:
        if encoding.lower().replace(" ", "").split(",")[-1] != "chunked":
            if response_to is None:
                raise BadRequest(f"a request with Transfer-Encoding {encoding!r} (only chunked)")
            return None
        if head.get("content-length") is not None:
            # Both framings: the classic smuggling shape; never relay it.
            raise BadRequest("both Transfer-Encoding and Content-Length")
        return "chunked"
    length = head.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise BadRequest(f"Content-Length {length!r} is not a number")
        return int(length)
    return 0 if response_to is None else None


Counter = Callable[[int], None]


class StreamFilter(Protocol):
    """What ``relay_body`` passes a body through: ``masking.Masker`` (answers) or
    ``placeholders.Swapper`` (requests)."""

    def mask(self, data: bytes) -> bytes: ...
    def feed(self, data: bytes) -> bytes: ...
    def flush(self) -> bytes: ...


async def relay_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     framing: str | int | None, count: Counter,
                     masker: StreamFilter | None = None) -> None:
    """Copy one body in its framing (None: until EOF); with a ``masker``, its bytes masked
    (a chunked body decoded, masked and re-chunked: ``masking.py``)."""
    if masker is not None:
        sink = _MaskedSink(writer, masker, count, chunked=framing == "chunked")
        if framing == "chunked":
            await _relay_chunked(reader, sink, sink.count_framing, decoded=True)
        elif framing is None:
            while data := await reader.read(CHUNK):
                sink.write(data)
                await sink.drain()
        else:
            await _relay_exactly(reader, sink, int(framing), sink.count_framing,
                                 "before its Content-Length")
        await sink.end()
        return
    if framing == "chunked":
        await _relay_chunked(reader, writer, count)
    elif framing is None:
        while data := await reader.read(CHUNK):
            writer.write(data)
            count(len(data))
            await writer.drain()
    else:
        await _relay_exactly(reader, writer, int(framing), count, "before its Content-Length")


class _MaskedSink:
    """A writer's stand-in that masks what passes (``Masker``); for a chunked body it is given
    the decoded data and writes chunks of its own."""

    def __init__(self, writer: asyncio.StreamWriter, masker: StreamFilter, count: Counter,
                 chunked: bool) -> None:
        self._writer, self._masker, self._count, self._chunked = writer, masker, count, chunked
        self._trailers: list[bytes] = []

    def count_framing(self, n: int) -> None:
        return None  # what the client gets is counted as it is sent (``_send``)

    def write(self, data: bytes) -> None:
        self._send(self._masker.feed(data))

    def trailer(self, line: bytes) -> None:
        self._trailers.append(self._masker.mask(line))

    def _send(self, data: bytes) -> None:
        if not data:
            return
        if self._chunked:
            data = b"%x\r\n%s\r\n" % (len(data), data)
        self._writer.write(data)
        self._count(len(data))

    async def drain(self) -> None:
        await self._writer.drain()

    async def end(self) -> None:
        self._send(self._masker.flush())
        if self._chunked:
            tail = b"0\r\n" + b"".join(self._trailers or [b"\r\n"])
            self._writer.write(tail)
            self._count(len(tail))
        await self._writer.drain()


async def _relay_exactly(reader: asyncio.StreamReader, writer: Any, size: int,
                         count: Counter, where: str) -> None:
    # In pieces: a declared size is the sender's word, not a buffer to allocate.
    remaining = size
    while remaining:
        data = await reader.read(min(CHUNK, remaining))
        if not data:
            raise BadRequest(f"the body ended {where}")
        remaining -= len(data)
        writer.write(data)
        count(len(data))
        await writer.drain()


_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")


async def _relay_chunked(reader: asyncio.StreamReader, writer: Any, count: Counter,
                         decoded: bool = False) -> None:
    """A chunked body, as it came — or, ``decoded``, only its data to ``writer.write`` and its
    trailers to ``writer.trailer`` (a ``_MaskedSink`` frames it anew)."""
    while True:
        line = await reader.readuntil(b"\r\n")
        size_text = line[:-2].split(b";", 1)[0].strip(b" \t")
        # Strict hex only ("0x5", "+5", "5_0" are what int() takes and a server may read otherwise).
        if not _CHUNK_SIZE.fullmatch(size_text):
            raise BadRequest(f"a bad chunk size {size_text[:20]!r}")
        size = int(size_text, 16)
        if not decoded:
            writer.write(line)
        count(len(line))
        if size == 0:
            while True:  # trailers, then the empty line
                trailer = await reader.readuntil(b"\r\n")
                if decoded:
                    writer.trailer(trailer)
                else:
                    writer.write(trailer)
                count(len(trailer))
                if trailer == b"\r\n":
                    await writer.drain()
                    return
        await _relay_exactly(reader, writer, size, count, "inside a chunk")
        end = await reader.readexactly(2)
        if end != b"\r\n":
            raise BadRequest("a chunk not followed by CRLF")
        if not decoded:
            writer.write(end)
        count(2)


REASONS = {400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed",
           421: "Misdirected Request", 502: "Bad Gateway", 503: "Service Unavailable",
           504: "Gateway Timeout"}


def error_response(status: int, body: str) -> bytes:
    """A complete plain-text response from the proxy itself; it closes the connection."""
    payload = (body.rstrip("\n") + "\n").encode("utf-8")
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
            "Content-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n"
            f"X-Toolseam-Egress: {'refused' if status == 403 else 'error'}\r\n\r\n")
    return head.encode("latin-1") + payload
