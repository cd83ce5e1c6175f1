"""The host side of the agent protocol over a unix socket (a socketpair, a listening agent, or
an engine's attach stream): requests by id, answers to their callers, live output to listeners.
An error answer becomes a seam exception through ``errors.map_agent_error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import select
import socket
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from toolseam_agent.attach_auth import TAG_LEN, Sealer, SealError
from toolseam_agent.frames import Frame, FrameError, Splitter, header
from toolseam_agent.wire import (
    EXPOSE,
    EXPOSE_TO_HOST,
    HELLO,
    OUTPUT_EVENT,
    PROTOCOL_VERSION,
    SHUTDOWN,
    STATUS_DEFAULTS,
    TUNNEL_EVENT,
    tunnel_number,
    tunnel_payload,
)
from toolseam_agent.wire import dumps as wire_dumps
from toolseam_agent.wire import loads as wire_loads

from ...seam.errors import CouldNotRunError
from ...seam.models import CouldNotRunCause, JobStatus, OutputChunk
from ...seam.protocol import OutputCallback
from .errors import map_agent_error
from .fd_lane import FdLane
from .ports import PortMux
from .tunnel import TunnelMux

# Unsent bytes at which the transport pauses us: a caller then waits for the agent to catch up,
# and tunnel data waits in the channel's own queue (the priority lane) — a request written
# meanwhile goes straight to the transport, ahead of every queued frame, and so waits behind
# at most this much tunnel data.
_PAUSE_AT = 1 << 17
_CONTROL = -1  # in the data queue: a tunnel's control line (eof, end, ack), kept in order
# What one read takes from the socket, into ONE buffer kept for the channel's life. As a plain
# protocol, asyncio's socket transport received into a fresh 256 KiB bytes object per read —
# above malloc's mmap threshold, so every answer cost an mmap, a page fault on fresh zeroed
# memory, an mremap and an munmap (docs/decisions.md, 140).
_READ_SIZE = 1 << 18
# Sending a descriptor waits for the transport's queue to empty: at most this long in all.
_PASSING_TRIES, _PASSING_WAIT_S = 500, 0.01
# Told the op of each request this task's calls hand to an agent (``serve --stdio`` at EOF:
# a bash call whose ``start`` reached the agent goes on there; one that did not, never ran).
REQUEST_SENT: ContextVar[Callable[[str], None] | None] = ContextVar("toolseam_request_sent",
                                                                   default=None)


class AgentChannel(asyncio.BufferedProtocol):
    """Request/answer correlation by id, plus live output events routed to listeners.

    A protocol rather than a StreamReader with a reading task: an answer is parsed and handed
    to its caller inside ``data_received``, one event-loop pass earlier. On a round trip that
    is most of the host's share of a ``bash`` call, that pass is worth saving. A buffered one
    (``get_buffer``/``buffer_updated``) on a socket: its reads go into one kept buffer; bytes
    that come another way (an engine's attach stream) go to ``data_received`` directly.
    """

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._listeners: dict[str, OutputCallback] = {}
        self._splitter = Splitter()  # lines and tunnels' data frames, as they come
        # tunnel data waiting for its turn, and the control lines sent after it
        self._data: deque[tuple[int, bytes]] = deque()
        self._pumping = False
        self._read_buffer = memoryview(bytearray(_READ_SIZE))
        self._transport: asyncio.Transport | None = None
        self._can_write: asyncio.Future[None] | None = None
        # The loop, kept: asking for the running loop costs a getpid syscall on every call.
        self._loop = asyncio.get_running_loop()
        self._lost: asyncio.Future[None] = self._loop.create_future()
        self.death: CouldNotRunError | None = None
        self.tunnels: TunnelMux | None = None  # egress mode: the session's proxied connections
        self.ports: PortMux | None = None  # exposed ports: their listeners and streams (ports.py)
        self.lane: FdLane | None = None  # egress connections handed over whole (fd_lane.py)
        # Whether the peer of this unix socket is the agent itself (a socketpair, its listening
        # socket), so a descriptor sent reaches it — not an engine's attach stream.
        self.passes_descriptors = False
        # A durable session's attached connection seals every line (toolseam_agent/attach_auth.py)
        self._seal: Sealer | None = None
        self._unseal: Sealer | None = None
        self.tampered = False  # the channel died of a line that did not hold its seal

    @classmethod
    async def over_socket(cls, sock: socket.socket, endpoint: str) -> AgentChannel:
        """A channel on a connected unix socket (the host agent's end of a socketpair)."""
        channel = cls(endpoint)
        await asyncio.get_running_loop().create_unix_connection(lambda: channel, sock=sock)
        channel.passes_descriptors = True
        return channel

    @classmethod
    async def connect(cls, path: str, endpoint: str) -> AgentChannel:
        """A channel to an agent listening on the unix socket at ``path``."""
        channel = cls(endpoint)
        await asyncio.get_running_loop().create_unix_connection(lambda: channel, path)
        channel.passes_descriptors = True
        return channel

    @property
    def alive(self) -> bool:
        return self.death is None

    def listen(self, job: str, callback: OutputCallback) -> None:
        self._listeners[job] = callback

    def adopt_listeners(self, old: AgentChannel) -> None:
        """After a reconnect: live output and egress go on over this channel (connections that
        were open ended with the old one — their bytes in flight are lost)."""
        self._listeners.update(old._listeners)
        if old.tunnels is not None:
            tunnels, old.tunnels = old.tunnels, None
            tunnels.end_all()
            self.carry_tunnels(tunnels)
        if old.ports is not None:
            ports, old.ports = old.ports, None
            ports.end_all()
            self.carry_ports(ports)

    def carry_tunnels(self, tunnels: TunnelMux) -> None:
        self.tunnels = tunnels
        tunnels.send_frame, tunnels.send_data = self.send_frame, self.send_data

    def carry_ports(self, ports: PortMux) -> PortMux:
        self.ports = ports
        ports.send_frame = self.send_frame
        ports.carrying = self.death is None
        return ports

    def send_frame(self, message: dict[str, Any] | bytes) -> None:
        """A message that has no answer (a tunnel's control frame; bytes: an exposed port's
        whole line already made); dropped once the channel is dead."""
        if self.death is None and self._transport is not None:
            if isinstance(message, bytes):
                self._transport.write(message if self._seal is None else b"".join(
                    self._seal.seal(line) + b"\n" for line in message.split(b"\n")[:-1]))
                return
            payload = wire_dumps(message).encode()
            if self._data:  # behind its connection's queued data: an eof or end must not overtake it
                self._data.append((_CONTROL, payload))
                return
            self._transport.write(payload + b"\n" if self._seal is None
                                  else self._seal.seal(payload) + b"\n")

    def send_data(self, number: int, data: bytes) -> None:
        """A tunnel's bytes, as a binary frame (``toolseam_agent/frames.py``) behind every
        request: queued here while the transport holds enough, so calls overtake it. Sealed
        when written, not when queued: the seals' sequence is the order on the wire."""
        if self.death is not None or self._transport is None:
            return
        self._data.append((number, data))
        self._pump()

    def _pump(self) -> None:
        transport = self._transport
        if transport is None or self._pumping:
            return
        self._pumping = True  # a write may call pause_writing/resume_writing back
        try:
            # until the transport pauses us (above _DATA_QUEUED_AT_MOST): resume_writing
            # pumps again once it is down to a quarter of that
            while self._data and self.death is None and self._can_write is None:
                number, data = self._data.popleft()
                if number == _CONTROL:
                    transport.write(data + b"\n" if self._seal is None
                                    else self._seal.seal(data) + b"\n")
                    continue
                head = header(number, len(data))
                transport.write(head + data if self._seal is None
                                else head + data + self._seal.seal_frame(head, data))
        finally:
            self._pumping = False

    def unlisten(self, job: str) -> None:
        self._listeners.pop(job, None)

    async def call(self, op: str, pass_fd: int | None = None, **fields: Any) -> dict[str, Any]:
        """Send one request; the answer's ``result``, or the mapped exception. ``pass_fd``: a
        descriptor sent with the request (``passes_descriptors`` channels only)."""
        if self.death is not None:
            raise self.death
        assert self._transport is not None
        rid = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._pending[rid] = future
        try:
            payload = wire_dumps({"id": rid, "op": op, **fields})
            if pass_fd is not None:
                await self._write_passing(payload.encode(), pass_fd)
            elif self._seal is None:
                self._transport.write((payload + "\n").encode())
            else:
                self._transport.write(self._seal.seal(payload.encode()) + b"\n")
            sent = REQUEST_SENT.get()
            if sent is not None:
                sent(op)
            if self._can_write is not None:
                await asyncio.shield(self._can_write)
            answer = await future
        finally:
            self._pending.pop(rid, None)
        if answer.get("ok"):
            result: dict[str, Any] = answer["result"]  # parsed for this call alone: no copy
            return result
        raise map_agent_error(answer.get("error") or {})

    async def _write_passing(self, payload: bytes, fd: int) -> None:
        """A request line with ``fd`` on its first byte (SCM_RIGHTS), written on the socket
        itself once the transport has nothing queued, so the line keeps its place in the stream
        (the transport's own writes cannot carry a descriptor). Sealed when written: the
        seals' sequence is the order on the wire."""
        assert self._transport is not None and self.passes_descriptors
        for _ in range(_PASSING_TRIES):
            if self.death is not None:
                raise self.death
            if not self._transport.get_write_buffer_size() and not self._data:
                break
            await asyncio.sleep(_PASSING_WAIT_S)
        else:
            raise CouldNotRunError(f"the channel to the sandbox agent at {self.endpoint} stayed "
                                   "full: a descriptor could not be sent", retryable=True,
                                   cause="busy")
        # From here to the write, nothing else may be written: no await.
        line = payload + b"\n" if self._seal is None else self._seal.seal(payload) + b"\n"
        raw = self._transport.get_extra_info("socket")
        with socket.socket(fileno=os.dup(raw.fileno())) as sock:
            while True:
                try:
                    sent = socket.send_fds(sock, [line], [fd])
                    break
                except (BlockingIOError, InterruptedError):
                    # the agent's socket buffer is full: a short wait in place (rare; an await
                    # would let another write overtake a line whose seal is already made)
                    if not select.select([], [sock], [], _PASSING_WAIT_S * _PASSING_TRIES)[1]:
                        raise CouldNotRunError(
                            f"the channel to the sandbox agent at {self.endpoint} stayed full: "
                            "a descriptor could not be sent", retryable=True,
                            cause="busy") from None
        if sent < len(line):
            self._transport.write(line[sent:])

    # --- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        transport.set_write_buffer_limits(high=_PAUSE_AT)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        # a copy of what came, so nothing parsed keeps the buffer: every byte is consumed here
        self.data_received(self._read_buffer[:nbytes].tobytes())

    def data_received(self, data: bytes) -> None:
        unseal = self._unseal
        self._splitter.tag_len = 0 if unseal is None else TAG_LEN
        try:
            for item in self._splitter.feed(data):
                if isinstance(item, Frame):  # egress's bytes: no JSON codec on the hot path
                    if unseal is not None:
                        unseal.open_frame(item.head, item.data, item.tag)
                    if self.tunnels is not None:
                        self.tunnels.data(item.number, item.data)
                    continue
                if unseal is not None:
                    item = unseal.open(item)
                if self.ports is not None and item.startswith(EXPOSE_TO_HOST):
                    found = tunnel_number(item, EXPOSE_TO_HOST)
                    if found is not None and found[1]:  # an exposed port's data line
                        self.ports.data(found[0], tunnel_payload(item))
                        continue
                self._dispatch(wire_loads(item.decode()))  # str: skips detect_encoding
        except SealError as exc:
            self.tampered = True  # the engine's state cannot explain it: say what it was
            self._die(f"a line from the session at {self.endpoint} did not hold its seal ({exc}): "
                      "something between this client and the agent changed the stream", "other")
            assert self._transport is not None
            self._transport.abort()
        except (ValueError, KeyError, TypeError, AttributeError, FrameError) as exc:  # not ours
            self._die(f"the sandbox agent at {self.endpoint} broke the protocol: {exc}",
                      "agent_failed")
            assert self._transport is not None
            self._transport.abort()

    def _dispatch(self, message: dict[str, Any]) -> None:
        event = message.get("ev")
        if event == OUTPUT_EVENT:
            listener = self._listeners.get(message.get("job"))  # type: ignore[arg-type]
            if listener is not None:
                listener(OutputChunk(stream=message["stream"], text=message["data"]))
            return
        if event == TUNNEL_EVENT:
            if self.tunnels is not None:
                self.tunnels.event(message)
            return
        if event == EXPOSE:
            if self.ports is not None:
                self.ports.event(message)
            return
        future = self._pending.get(message.get("id"))  # type: ignore[arg-type]
        if future is not None and not future.done():
            future.set_result(message)

    def eof_received(self) -> bool:
        return False  # close the transport: the agent has nothing more to say

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None:
            self._die(f"lost the channel to the sandbox agent at {self.endpoint}: {exc}")
        self._die(f"the sandbox agent at {self.endpoint} exited")
        if self.tunnels is not None:
            self.tunnels.end_all()
        if self.lane is not None:
            self.lane.stop()
        if self.ports is not None:
            self.ports.carrying = False
            self.ports.end_all()
        self.resume_writing()
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        if self._can_write is None:
            self._can_write = self._loop.create_future()

    def resume_writing(self) -> None:
        if self._can_write is not None:
            if not self._can_write.done():
                self._can_write.set_result(None)
            self._can_write = None
        self._pump()

    # --- lifecycle ------------------------------------------------------------------------
    async def hello(self) -> dict[str, Any]:
        """The agent's ``hello`` answer, once its protocol is known to be this host's: an agent
        staged by another toolseam version is could-not-run, naming both versions."""
        answer = await self.call(HELLO)
        theirs = answer.get("protocol")
        if theirs != PROTOCOL_VERSION:
            raise CouldNotRunError(
                f"the sandbox agent at {self.endpoint} speaks protocol {theirs!r}, this toolseam "
                f"speaks protocol {PROTOCOL_VERSION}: stage the agent of this toolseam version",
                retryable=False, cause="agent_failed")
        return answer

    def _die(self, reason: str, cause: CouldNotRunCause = "sandbox_lost") -> None:
        """The channel ended: by default because its agent did (a sandbox that is gone; a
        liveness that knows better, a copy-mode drop, says so in ``explain``)."""
        self._data.clear()  # tunnel data never sent: its connections end with the channel
        if self.death is None:
            self.death = CouldNotRunError(reason, retryable=True, cause=cause)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(self.death)

    async def shutdown(self, answer_s: float = 5.0, drain_s: float = 10.0) -> None:
        """End the session's agent: it kills every job and exits; then the channel closes."""
        if self.alive:
            with contextlib.suppress(CouldNotRunError, TimeoutError):
                await asyncio.wait_for(self.call(SHUTDOWN), answer_s)
        await self.close(drain_s)

    async def close(self, drain_s: float = 10.0) -> None:
        """Close our sending side, then read to the end (the agent finishes killing jobs first).
        Exposed ports are this client's: their listeners close first."""
        if self.ports is not None:
            self.ports.close_listeners()
        transport = self._transport
        if transport is not None and not transport.is_closing():
            try:
                if transport.can_write_eof():  # a TLS stream cannot half-close
                    transport.write_eof()
            except (OSError, RuntimeError):
                transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._lost), drain_s)
        except TimeoutError:
            if transport is not None:
                transport.abort()
            await self._lost


def job_status(raw: dict[str, Any]) -> JobStatus:
    """An agent status answer as the seam model (the agent leaves out defaults)."""
    fields = {**STATUS_DEFAULTS, **raw}
    fields["chunks"] = [{"stream": s, "text": t} for s, t in fields["chunks"]]
    return JobStatus.model_validate(fields)

