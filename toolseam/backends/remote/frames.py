"""The remote wire's frames and its handshake, shared by both ends of any byte-stream transport
(a unix socket here; a TCP connection to a Ray node or a pod tomorrow).

Frames: a 4-byte big-endian length, then the body; a frame longer than its side's limit is
refused before a byte of its body is read. The handshake, before anything else crosses, is
secret-first HMAC both ways (``handshake.py``): the client says a nonce, the server answers its
nonce and its proof of the server key, the client checks it and answers its own proof, the
server answers ``ok`` or a refusal in words. Until then everything is split as bytes: nothing a
peer sends is decoded (``codec.py``) before it has proved the key.
"""

from __future__ import annotations

import asyncio
import struct

from .codec import MAX_ANSWER, MAX_REQUEST
from .handshake import holds, is_nonce, nonce, proof

HELLO = b"toolseam-remote-1"
MAX_HELLO = 1024  # a hello, a proof or a refusal is shorter than this: a longer one is not ours
HELLO_TIMEOUT_S = 5.0  # a peer that says nothing is dropped: silent connections cannot pile up
OK = b"ok"
_LENGTH = struct.Struct(">I")
__all__ = ["MAX_ANSWER", "MAX_REQUEST", "FrameTooLarge", "client_handshake", "frame",
           "read_frame", "server_handshake"]


class FrameTooLarge(ValueError):
    """A peer announced a frame longer than this side takes."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"a frame of {length} bytes was refused (at most {limit})")
        self.length, self.limit = length, limit


class Refused(Exception):
    """The other end did not prove the key (or refused ours): the message says which."""


def frame(body: bytes) -> bytes:
    return _LENGTH.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes:
    """One frame's body; ``FrameTooLarge`` before its body is read when it is over ``limit``;
    ``asyncio.IncompleteReadError`` when the peer left."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > limit:
        raise FrameTooLarge(length, limit)
    return await reader.readexactly(length)


async def server_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           key: bytes, context: str) -> None:
    """The server's side: returns once the client proved ``key``; ``Refused`` (the client was
    told why) otherwise."""
    async with asyncio.timeout(HELLO_TIMEOUT_S):
        magic, _, theirs_raw = (await read_frame(reader, MAX_HELLO)).partition(b"\0")
        theirs = theirs_raw.decode("ascii", "replace")
        if magic != HELLO or not is_nonce(theirs):
            writer.write(frame(b"refused: not a toolseam remote hello"))
            raise Refused("not a toolseam remote hello")
        mine = nonce()
        writer.write(frame(f"{mine}\0{proof(key, 'server', context, theirs, mine)}".encode()))
        given = (await read_frame(reader, MAX_HELLO)).decode("ascii", "replace")
        if not holds(key, "client", context, theirs, mine, given):
            writer.write(frame(b"refused: the client did not prove the server key"))
            raise Refused("the client did not prove the server key")
        writer.write(frame(OK))


async def client_handshake(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           key: bytes, context: str) -> None:
    """The client's side: returns once both ends proved ``key``; ``Refused`` otherwise (no
    request was sent: the server never proved it holds the key, or refused ours)."""
    async with asyncio.timeout(HELLO_TIMEOUT_S):
        mine = nonce()
        writer.write(frame(HELLO + b"\0" + mine.encode()))
        theirs_raw, _, their_proof = (await read_frame(reader, MAX_HELLO)).partition(b"\0")
        theirs = theirs_raw.decode("ascii", "replace")
        if not (is_nonce(theirs) and holds(key, "server", context, mine, theirs,
                                           their_proof.decode("ascii", "replace"))):
            raise Refused("the server did not prove the server key")
        writer.write(frame(proof(key, "client", context, mine, theirs).encode()))
        verdict = await read_frame(reader, MAX_HELLO)
        if verdict != OK:
            raise Refused(verdict.decode("utf-8", "replace"))
