"""Egress tunnels' binary data frames between the channel's JSON lines (``toolseam_agent/frames.py``),
their seals on a durable session's connection, and the host's priority lane (a call's request
overtakes tunnel data queued on the channel)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam.backends.agentlink import channel as channel_module
from toolseam.backends.agentlink.channel import AgentChannel
from toolseam.seam.errors import CouldNotRunError
from toolseam_agent.attach_auth import TAG_LEN, Sealer, SealError
from toolseam_agent.frames import MAX_DATA, Frame, FrameError, Splitter, header

_line = st.dictionaries(st.text(max_size=8), st.text(max_size=30), max_size=3).map(
    lambda d: json.dumps(d).encode())  # what a JSON line can be: never a raw NUL or newline
_frame = st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=300))
_items = st.lists(st.one_of(_line, _frame), min_size=1, max_size=8)


def _wire(items: list[bytes | tuple[int, bytes]], seal: Sealer | None) -> bytes:
    out = b""
    for item in items:
        if isinstance(item, tuple):
            head = header(item[0], len(item[1]))
            out += head + item[1] + (seal.seal_frame(head, item[1]) if seal else b"")
        else:
            out += (seal.seal(item) if seal else item) + b"\n"
    return out


@settings(max_examples=150, deadline=None)
@given(items=_items, cuts=st.lists(st.integers(0, 4000), max_size=6), sealed=st.booleans())
def test_lines_and_frames_come_out_whole_however_the_bytes_are_cut(
        items: list[bytes | tuple[int, bytes]], cuts: list[int], sealed: bool) -> None:
    key = b"k" * 32
    data = _wire(items, Sealer(key, b"A") if sealed else None)
    splitter = Splitter()
    splitter.tag_len = TAG_LEN if sealed else 0
    found: list[bytes | Frame] = []
    at = 0
    for cut in [*sorted({min(cut, len(data)) for cut in cuts}), len(data)]:
        found += splitter.feed(data[at:cut]) if cut > at else []
        at = cut
    unseal = Sealer(key, b"A")
    got: list[bytes | tuple[int, bytes]] = []
    for item in found:
        if isinstance(item, Frame):
            if sealed:
                unseal.open_frame(item.head, item.data, item.tag)
            got.append((item.number, item.data))
        else:
            got.append(unseal.open(item) if sealed else item)
    assert got == items


def test_a_frame_longer_than_the_most_is_refused() -> None:
    with pytest.raises(FrameError, match="at most"):
        Splitter().feed(header(1, MAX_DATA + 1))


def test_a_sealed_frame_changed_replayed_or_reordered_does_not_hold() -> None:
    key = b"s" * 32
    seal = Sealer(key, b"A")
    head = header(3, 5)
    first = seal.seal_frame(head, b"hello")
    line = seal.seal(b'{"ev":"tun","c":3,"a":5}')
    second = seal.seal_frame(head, b"world")
    # in order: every one holds
    opened = Sealer(key, b"A")
    opened.open_frame(head, b"hello", first)
    opened.open(line)
    opened.open_frame(head, b"world", second)
    # changed data, another connection number, a frame where the line was: none holds
    for check in (lambda s: s.open_frame(head, b"hellO", first),
                  lambda s: s.open_frame(header(4, 5), b"hello", first),
                  lambda s: (s.open_frame(head, b"hello", first),
                             s.open_frame(head, b"world", second))):
        with pytest.raises(SealError):
            check(Sealer(key, b"A"))
    # the other direction's key letter: not a seal of this direction
    with pytest.raises(SealError):
        Sealer(key, b"C").open_frame(head, b"hello", first)


async def _pair() -> tuple[AgentChannel, socket.socket]:
    ours, theirs = socket.socketpair()
    channel = await AgentChannel.over_socket(ours, "test agent")
    return channel, theirs


async def test_a_frame_announcing_too_much_ends_the_channel() -> None:
    channel, theirs = await _pair()
    try:
        theirs.sendall(header(1, MAX_DATA + 1))
        with pytest.raises(CouldNotRunError, match="broke the protocol"):
            await asyncio.wait_for(channel.call("hello"), 5)
    finally:
        theirs.close()
        await channel.close(1)


async def test_a_request_overtakes_tunnel_data_queued_on_the_channel() -> None:
    """The agent end reads nothing while 8 MiB of tunnel data is queued, then a call is made:
    its request reaches the agent behind at most the transport's share and the socket's
    buffers, not behind the 8 MiB (the priority lane; before it, behind all of it)."""
    channel, theirs = await _pair()
    try:
        piece = b"x" * (128 * 1024)
        for _ in range(64):
            channel.send_data(7, piece)
        call = asyncio.ensure_future(channel.call("hello"))
        await asyncio.sleep(0.05)
        theirs.setblocking(False)
        splitter = Splitter()
        before = 0  # tunnel bytes the agent reads before the request
        request = None
        deadline = asyncio.get_running_loop().time() + 20
        while request is None and asyncio.get_running_loop().time() < deadline:
            try:
                data = theirs.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
                continue
            for item in splitter.feed(data):
                if isinstance(item, Frame):
                    assert item.number == 7 and item.data == piece
                    before += len(item.data)
                elif request is None:
                    request = json.loads(item)
        assert request is not None and request["op"] == "hello"
        buffers = (theirs.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
                   + theirs.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) * 2)
        assert before <= channel_module._PAUSE_AT + buffers + len(piece), before
        assert before < 64 * len(piece) // 2
        theirs.setblocking(True)
        theirs.sendall(json.dumps({"id": request["id"], "ok": True, "result": {}}).encode()
                       + b"\n")
        assert await asyncio.wait_for(call, 5) == {}
    finally:
        theirs.close()
        await channel.close(1)


async def test_a_tunnels_end_never_overtakes_its_queued_data() -> None:
    """An eof sent after data still queued in the lane reaches the agent after that data (it
    once went straight out, and the client lost the end of an upload)."""
    channel, theirs = await _pair()
    try:
        piece = b"y" * (128 * 1024)
        for _ in range(16):
            channel.send_data(5, piece)
        channel.send_frame({"id": 0, "op": "tun", "c": 5, "o": "eof"})
        theirs.setblocking(False)
        splitter, got, ended = Splitter(), 0, False
        deadline = asyncio.get_running_loop().time() + 20
        while not ended and asyncio.get_running_loop().time() < deadline:
            try:
                data = theirs.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
                continue
            for item in splitter.feed(data):
                if isinstance(item, Frame):
                    assert not ended
                    got += len(item.data)
                else:
                    assert json.loads(item)["o"] == "eof"
                    ended = True
        assert ended and got == 16 * len(piece)
    finally:
        theirs.close()
        await channel.close(1)
