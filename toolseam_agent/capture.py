"""Bounded capture of a job's stdout and stderr: head + tail per stream, arrival order kept.

Each stream keeps its first ``limit // 2`` bytes and its last ``limit - limit // 2`` bytes; what
falls between is counted, not kept, so a flood (``yes``) costs bounded memory however long it
runs. Every chunk carries a sequence number across both streams, so the combined output is put
back together in the order the bytes arrived. Decoding is incremental UTF-8 with replacement:
a character split across reads is never split in the output, and at a truncation gap the
partial character on either side is dropped rather than turned into garbage.

The snapshot also says where each gap is (its character offset in the combined text), how many
bytes and line breaks it dropped, and how many line breaks each stream wrote in all, so the
text a model is shown can mark the join on a line of its own (``toolseam.model_text``).
"""

from __future__ import annotations

import codecs
from collections import deque
from typing import Any

STREAMS = ("stdout", "stderr")
DEFAULT_LIMIT = 1 << 20  # 1 MiB per stream


class _Stream:
    def __init__(self, limit: int) -> None:
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head: list[tuple[int, bytes]] = []
        self.head_size = 0
        self.tail: deque[tuple[int, bytes]] = deque()
        self.tail_size = 0
        self.total = 0
        self.newlines = 0  # line breaks written in all (bytes.count is a memchr: cheap)
        self.dropped_newlines = 0
        self.dropped_ends_line = False  # the last byte dropped was a line break

    def add(self, seq: int, data: bytes) -> None:
        self.total += len(data)
        self.newlines += data.count(b"\n")
        room = self.head_limit - self.head_size
        if room > 0:
            self.head.append((seq, data[:room]))
            self.head_size += min(room, len(data))
            data = data[room:]
        if not data:
            return
        self.tail.append((seq, data))
        self.tail_size += len(data)
        while self.tail_size > self.tail_limit:
            excess = self.tail_size - self.tail_limit
            first_seq, first = self.tail[0]
            if len(first) <= excess:
                self.tail.popleft()
                self.tail_size -= len(first)
                self._dropped(first)
            else:
                self.tail[0] = (first_seq, first[excess:])
                self.tail_size -= excess
                self._dropped(first[:excess])

    def _dropped(self, data: bytes) -> None:
        self.dropped_newlines += data.count(b"\n")
        self.dropped_ends_line = data.endswith(b"\n")

    @property
    def truncated(self) -> bool:
        return self.total > self.head_size + self.tail_size

    def pieces(self) -> list[tuple[int, str, bool]]:
        """Decoded (seq, text, gap_before) pieces of what was kept; ``gap_before`` marks the
        first piece after the truncation gap."""
        if not self.total:
            return []
        out: list[tuple[int, str, bool]] = []
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for seq, data in self.head:
            out.append((seq, decoder.decode(data), False))
        gap = self.truncated
        if self.truncated:
            decoder = codecs.getincrementaldecoder("utf-8")("replace")  # drop the cut character
            skip_continuation = True
        else:
            skip_continuation = False
        for seq, data in self.tail:
            if skip_continuation:
                cut = 0
                while cut < min(3, len(data)) and 0x80 <= data[cut] <= 0xBF:
                    cut += 1
                data, skip_continuation = data[cut:], False
            out.append((seq, decoder.decode(data), gap))
            gap = False
        tail_end = decoder.decode(b"", final=True)
        if tail_end and out:
            seq, text, before = out[-1]
            out[-1] = (seq, text + tail_end, before)
        return out


class OutputCapture:
    """The bounded record of one job's output, plus incremental decoders for live streaming."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._streams = {name: _Stream(limit) for name in STREAMS}
        self._live: dict[str, codecs.IncrementalDecoder] = {}  # made when a stream is streamed
        self._seq = 0

    def add(self, stream: str, data: bytes) -> None:
        self._seq += 1
        self._streams[stream].add(self._seq, data)

    def live_text(self, stream: str, data: bytes, final: bool = False) -> str:
        """The text of ``data`` for a streaming event, holding back a split character."""
        decoder = self._live.get(stream)
        if decoder is None:
            decoder = self._live[stream] = codecs.getincrementaldecoder("utf-8")("replace")
        return decoder.decode(data, final=final)

    def snapshot(self) -> dict[str, Any]:
        """Kept output as ``[[stream, text], ...]`` in arrival order, with counts and flags."""
        tagged = [(seq, name, text, gap) for name in STREAMS
                  for seq, text, gap in self._streams[name].pieces() if text or gap]
        tagged.sort(key=lambda item: item[0])
        chunks: list[list[str]] = []
        gaps: list[list[Any]] = []
        at = 0  # characters of combined text so far
        for _, name, text, gap in tagged:
            if gap:
                stream = self._streams[name]
                dropped = stream.total - stream.head_size - stream.tail_size
                gaps.append([at, name, dropped, stream.dropped_newlines, stream.dropped_ends_line])
            at += len(text)
            if not text:
                continue
            if chunks and chunks[-1][0] == name:
                chunks[-1][1] += text
            else:
                chunks.append([name, text])
        result: dict[str, Any] = {"chunks": chunks}
        for name in STREAMS:
            result[f"{name}_bytes"] = self._streams[name].total
            result[f"{name}_truncated"] = self._streams[name].truncated
            result[f"{name}_lines"] = self._streams[name].newlines
        if gaps:
            result["gaps"] = gaps
        return result

    def add_snapshot(self, status: dict[str, Any]) -> None:
        """The snapshot into a job status, its fields at ``wire.STATUS_DEFAULTS`` left out."""
        for key, value in self.snapshot().items():
            if value:  # 0, False and [] are the defaults
                status[key] = value
