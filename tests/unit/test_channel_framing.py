"""The host end of the agent wire (``AgentChannel.data_received``) reads lines however they come.

A whole answer in one read takes a fast path (no join, no split); pieces, several answers in one
read, and a line that is not the wire's must come out as before. The agent end here is a raw
socket the test writes bytes to, as a hostile or broken agent might.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam.backends.agentlink.channel import AgentChannel
from toolseam.seam.errors import CouldNotRunError


async def _pair() -> tuple[AgentChannel, socket.socket]:
    ours, theirs = socket.socketpair()
    channel = await AgentChannel.over_socket(ours, "test agent")
    theirs.setblocking(False)
    return channel, theirs


def _answer(rid: int, value: str) -> bytes:
    return (json.dumps({"id": rid, "ok": True, "result": {"value": value}}) + "\n").encode()


async def _calls(channel: AgentChannel, count: int) -> list[asyncio.Task[dict[str, object]]]:
    tasks = [asyncio.ensure_future(channel.call("hello")) for _ in range(count)]
    await asyncio.sleep(0)  # each has sent its request and waits
    return tasks


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.text(max_size=40), min_size=1, max_size=4),
       cuts=st.lists(st.integers(min_value=1, max_value=50), max_size=6))
def test_answers_in_any_pieces(values: list[str], cuts: list[int]) -> None:
    async def run() -> None:
        channel, agent = await _pair()
        tasks = await _calls(channel, len(values))
        stream = b"".join(_answer(rid, value) for rid, value in enumerate(values, start=1))
        at = 0
        for cut in [*cuts, len(stream)]:  # the stream in pieces, each its own read
            piece, at = stream[at:at + cut], at + cut
            if piece:
                agent.send(piece)
                await asyncio.sleep(0.001)
        got = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert [answer["value"] for answer in got] == values
        agent.close()
        await channel.close(1)

    asyncio.run(run())


@pytest.mark.parametrize("line", [b"not json\n", b"[1, 2]\n", b'{"id": 1, "ok": true}x\n', b"\n"])
async def test_a_line_that_is_not_the_wire_ends_the_channel(line: bytes) -> None:
    channel, agent = await _pair()
    (task,) = await _calls(channel, 1)
    agent.send(line)
    with pytest.raises(CouldNotRunError, match="broke the protocol"):
        await asyncio.wait_for(task, 5)
    assert not channel.alive
    agent.close()


async def test_an_answer_bigger_than_a_read_then_more_answers() -> None:
    """The socket is read into one kept buffer (256 KiB a read): a longer answer spans reads
    and is joined; answers behind it in the same stream come out too, in order."""
    channel, agent = await _pair()
    tasks = await _calls(channel, 3)
    big = "x" * 700_000
    stream = _answer(1, "small") + _answer(2, big) + _answer(3, "after")
    agent.setblocking(True)
    await asyncio.get_running_loop().run_in_executor(None, agent.sendall, stream)
    got = await asyncio.wait_for(asyncio.gather(*tasks), 10)
    assert [answer["value"] for answer in got] == ["small", big, "after"]
    agent.close()
    await channel.close(1)


async def test_reads_go_into_one_kept_buffer() -> None:
    """Not a fresh bytes object per read: asyncio's plain-protocol path allocated 256 KiB per
    read (an mmap, a page fault, an mremap and an munmap on every answer)."""
    channel, agent = await _pair()
    assert isinstance(channel, asyncio.BufferedProtocol)
    first = channel.get_buffer(-1)
    assert first is channel.get_buffer(-1) and len(first) >= 1 << 16
    (task,) = await _calls(channel, 1)
    agent.send(_answer(1, "one"))
    assert (await asyncio.wait_for(task, 5))["value"] == "one"
    assert channel.get_buffer(-1) is first
    agent.close()
    await channel.close(1)
