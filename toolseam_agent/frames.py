"""Binary data frames for egress tunnels, between the JSON lines of the agent's channel.

A tunnel's bytes are most of what a busy channel carries. As base64 in JSON lines they cost a
third more bytes and, at both ends, 30-45 % of the CPU (docs/benchmarks.md), so a data frame is
raw bytes behind a fixed header instead::

    NUL | connection number (4 bytes, big-endian) | length (4 bytes) | data [| tag]

A JSON line never holds a raw NUL (JSON escapes every control character) and every line ends in
a newline, so a NUL where a line would begin can only be a frame. On a sealed channel (a durable
session's attached connection, ``attach_auth.py``) ``tag`` is the same 32 hex characters a line
carries, over the header and the data, in the same sequence as the lines: a frame cannot be
changed, dropped, reordered or replayed unnoticed either. Standard library only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MARK = 0
HEADER = struct.Struct(">BII")  # MARK, connection number, length
MAX_DATA = 1 << 20  # a frame announcing more is not one of ours: the channel is broken


class FrameError(ValueError):
    """Bytes that cannot be a frame (a length beyond ``MAX_DATA``)."""


@dataclass(frozen=True, slots=True)
class Frame:
    """A data frame as read: ``head`` (the header) and ``data`` are what a tag covers."""

    number: int
    head: bytes
    data: bytes
    tag: bytes


def header(number: int, size: int) -> bytes:
    return HEADER.pack(MARK, number, size)


class Splitter:
    """A channel's bytes, in the order they came, as JSON lines (bytes, no newline) and frames.

    ``tag_len`` is 0, or the seal's length once the channel is sealed. A big line or frame that
    arrives in many reads is joined once, when it is whole."""

    def __init__(self) -> None:
        self.tag_len = 0
        self._pieces: list[bytes] = []
        self._held = 0  # bytes in _pieces
        self._need = 0  # bytes _pieces must hold before it is worth looking again (0: unknown)

    def feed(self, data: bytes) -> list[bytes | Frame]:
        if self._pieces:
            self._held += len(data)
            self._pieces.append(data)
            if self._held < self._need or (not self._need and b"\n" not in data):
                return []  # a frame not whole yet, or a line without its end yet
            data = b"".join(self._pieces)
            self._pieces.clear()
        found: list[bytes | Frame] = []
        at, size, tag_len = 0, len(data), self.tag_len
        while at < size:
            if data[at] == MARK:
                if size - at < HEADER.size:
                    self._keep(data, at, at + HEADER.size)
                    return found
                _, number, length = HEADER.unpack_from(data, at)
                if length > MAX_DATA:
                    raise FrameError(f"a data frame of {length} bytes (at most {MAX_DATA})")
                body = at + HEADER.size
                end = body + length + tag_len
                if end > size:
                    self._keep(data, at, end)
                    return found
                found.append(Frame(number, data[at:body], data[body:body + length],
                                   data[end - tag_len:end]))
                at = end
            else:
                newline = data.find(b"\n", at)
                if newline < 0:
                    self._keep(data, at, 0)
                    return found
                found.append(data[at:newline])
                at = newline + 1
        self._held = self._need = 0
        return found

    def _keep(self, data: bytes, at: int, end: int) -> None:
        rest = data[at:]
        self._pieces, self._held = [rest], len(rest)
        self._need = end - at  # 0 for a line: wait for a newline

    def reset(self) -> None:
        """A new connection (a durable agent's next attach): nothing of the last one is kept."""
        self._pieces.clear()
        self._held = self._need = 0
