"""Egress's lane (``toolseam_agent/fd_passing.py``, ``toolseam/backends/agentlink/fd_lane.py``):
what the host takes from it is a connected TCP socket with the agent's header and nothing else —
a record without one, with two, with a file, a pipe, a listener, a unix socket or a header of
another shape is refused and every descriptor it carried closed; the agent keeps the host's
descriptors close-on-exec (a job never inherits the lane) and at most a few of them."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

import pytest

from toolseam.backends.agentlink.fd_lane import FdLane
from toolseam_agent import fd_passing


def open_fds() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/fd")}


async def listening() -> tuple[socket.socket, int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    return server, server.getsockname()[1]


async def connected_pair() -> tuple[socket.socket, socket.socket]:
    server, port = await listening()
    client = socket.create_connection(("127.0.0.1", port))
    theirs, _ = server.accept()
    server.close()
    return client, theirs


class Lane:
    """An FdLane reading records the test writes on the agent's end."""

    def __init__(self) -> None:
        self.served: list[tuple[dict[str, Any], bytes]] = []
        self.held = False
        self.lane = FdLane(self._serve)
        assert self.lane.agent_end is not None
        self.agent = socket.socket(fileno=os.dup(self.lane.agent_end.fileno()))
        self.lane.start()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     opened: dict[str, Any] | None = None) -> None:
        transport = writer.transport
        assert isinstance(transport, asyncio.ReadTransport)
        # a captured connection comes held, for the proxy to choose (TLS or bytes): as it does
        self.held = not transport.is_reading()
        transport.resume_reading()
        data = await reader.readexactly(5)
        writer.write(b"seen:" + data)
        await writer.drain()
        self.served.append((dict(opened or {}), data))

    def send(self, header: Any, fds: list[int]) -> None:
        raw = header if isinstance(header, bytes) else json.dumps(header).encode()
        socket.send_fds(self.agent, [raw], fds)

    async def settle(self) -> None:
        for _ in range(50):
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        self.agent.close()
        await self.lane.close()


async def test_a_connection_with_its_header_is_served_with_where_it_was_dialled() -> None:
    lane = Lane()
    client, theirs = await connected_pair()
    lane.send({"c": 1, "h": "db.test", "p": 5432, "pid": 7, "argv": ["psql"], "job": "j-1"},
              [theirs.fileno()])
    theirs.close()  # the agent keeps no copy
    client.sendall(b"hello")
    client.settimeout(5)
    assert await asyncio.to_thread(client.recv, 100) == b"seen:hello"
    await lane.settle()
    [(opened, data)] = lane.served
    assert data == b"hello" and lane.held
    assert opened == {"egress_target": ("db.test", 5432),
                      "egress_origin": {"pid": 7, "argv": ["psql"], "job": "j-1"}}
    client.close()
    await lane.close()


@pytest.mark.parametrize("what", ["pipe", "file", "listener", "unix", "udp", "unconnected",
                                  "two", "none", "not json", "no number", "bad port", "bad pid"])
async def test_anything_but_a_connection_and_its_header_is_refused_and_closed(
        what: str, tmp_path: Any) -> None:
    lane = Lane()
    await lane.settle()
    before = open_fds()
    made: list[Any] = []
    header: Any = {"c": 1}
    if what == "pipe":
        r, w = os.pipe()
        made, fds = [r, w], [r]
    elif what == "file":
        path = tmp_path / "f"
        path.write_text("x")
        fd = os.open(path, os.O_RDONLY)
        made, fds = [fd], [fd]
    elif what == "listener":
        server, _ = await listening()
        made, fds = [server], [server.fileno()]
    elif what == "unix":
        a, b = socket.socketpair()
        made, fds = [a, b], [a.fileno()]
    elif what == "udp":
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.connect(("127.0.0.1", 9))
        made, fds = [u], [u.fileno()]
    elif what == "unconnected":
        s = socket.socket()
        made, fds = [s], [s.fileno()]
    else:
        client, theirs = await connected_pair()
        made, fds = [client, theirs], [theirs.fileno()]
        if what == "two":
            fds = [theirs.fileno(), client.fileno()]
        elif what == "none":
            fds = []
        elif what == "not json":
            header = b"{not json"
        elif what == "no number":
            header = {"h": "x.test", "p": 80}
        elif what == "bad port":
            header = {"c": 1, "h": "x.test", "p": 70000}
        elif what == "bad pid":
            header = {"c": 1, "pid": "1; rm -rf /"}
    lane.send(header, fds)
    for item in made:
        item.close() if hasattr(item, "close") else os.close(item)
    await lane.settle()
    assert lane.served == []
    assert open_fds() <= before, "a descriptor from a refused record was kept"
    await lane.close()


def test_the_agent_keeps_passed_descriptors_close_on_exec_and_a_few_at_most() -> None:
    host, agent = socket.socketpair()
    received = fd_passing.Received()
    sock = received.socket_for(agent.fileno())
    assert sock is not None
    pipes = [os.pipe() for _ in range(6)]
    for r, w in pipes:
        socket.send_fds(host, [b"x"], [r])
    got = b""
    while len(got) < 6:
        got += received.receive(sock, 1)
    assert len(received.fds) == 4  # the rest were closed at once
    assert all(not os.get_inheritable(fd) for fd in received.fds)
    assert received.take_lane() is None  # pipes, not a lane: each closed as it was looked at
    assert received.fds == []
    lane_host, lane_agent = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    socket.send_fds(host, [b"y"], [lane_agent.fileno()])
    received.receive(sock, 1)
    lane = received.take_lane()
    assert lane is not None and lane.type == socket.SOCK_SEQPACKET
    assert not os.get_inheritable(lane.fileno())
    for r, w in pipes:
        os.close(r)
        os.close(w)
    for s in (lane, lane_host, lane_agent, host, agent):
        s.close()
    received.forget()


def test_a_new_channel_on_a_reused_descriptor_number_is_not_read_through_the_old_one() -> None:
    received = fd_passing.Received()
    first, peer = socket.socketpair()
    number = first.fileno()
    assert received.socket_for(number) is not None
    first.close()
    peer.close()
    second, peer2 = socket.socketpair()
    # a durable agent's next client: it forgets the last connection's socket
    received.forget()
    sock = received.socket_for(second.fileno())
    peer2.sendall(b"new")
    assert sock is not None and received.receive(sock, 10) == b"new"
    for s in (second, peer2):
        s.close()
    received.forget()
    assert number >= 0
