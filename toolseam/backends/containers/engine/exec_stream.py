"""A two-way stream to a new process in a running container, through the engine's exec API:
``POST …/containers/ID/exec`` makes it, ``POST …/exec/EID/start`` upgrades the connection to
the same multiplexed stream an attach gives (``attach.py``). Used by copy mode's durable
sessions: each connection to the agent is an exec of a tiny relay (``toolseam_agent/relay.py``)
into the agent's socket, so a connection that ends ends only that relay, never the agent — the
engine's attach stream to the agent's own stdin does not survive (podman closes a container's
stdin whenever an attach ends).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

from ....seam.errors import CouldNotRunError
from ...agentlink.channel import AgentChannel
from .attach import EngineAddress, _AttachProtocol, _keepalive

_TIMEOUT_S = 15.0


def api_prefix(attach_path: str) -> str:
    """The engine's API prefix, as its dialect spells the attach path: ``/v1.41`` (docker),
    ``/v4.0.0/libpod`` (podman)."""
    return attach_path.split("/containers/", 1)[0]


async def _connect(address: EngineAddress, protocol: asyncio.Protocol) -> asyncio.Transport:
    loop = asyncio.get_running_loop()
    if address.unix_path is not None:
        transport, _ = await loop.create_unix_connection(lambda: protocol, address.unix_path)
    else:
        transport, _ = await loop.create_connection(
            lambda: protocol, address.host or "localhost", address.port or 0, ssl=address.tls,
            server_hostname=address.host if address.tls else None)
        _keepalive(transport.get_extra_info("socket"))
    return transport


def _request(address: EngineAddress, path: str, body: dict[str, Any], upgrade: bool) -> bytes:
    data = json.dumps(body).encode()
    connection = "Connection: Upgrade\r\nUpgrade: tcp\r\n" if upgrade else "Connection: close\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: {address.host or 'localhost'}\r\n{connection}"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            ).encode() + data


class _Collect(asyncio.Protocol):
    """One plain HTTP exchange on its own connection: the request, then everything to EOF."""

    def __init__(self, request: bytes) -> None:
        self.request = request
        self.data = bytearray()
        self.done: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(bytes(self.data))


def _body(answer: bytes) -> tuple[str, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = bytearray(), body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line.split(b";")[0] or b"0", 16)
            if size == 0:
                break
            out += rest[:size]
            rest = rest[size + 2:]
        body = bytes(out)
    return status, body


async def exec_channel(address: EngineAddress, attach_path: str, container: str,
                       argv: list[str], channel: AgentChannel,
                       env: dict[str, str] | None = None) -> None:
    """Run ``argv`` in ``container`` with its stdin and stdout as ``channel``'s transport;
    ``env`` overrides variables of the container's environment for this process."""
    prefix = api_prefix(attach_path)
    create = _Collect(_request(address, f"{prefix}/containers/{container}/exec", {
        "AttachStdin": True, "AttachStdout": True, "AttachStderr": True, "Tty": False,
        "Cmd": argv, "Env": [f"{k}={v}" for k, v in (env or {}).items()]}, upgrade=False))
    try:
        transport = await asyncio.wait_for(_connect(address, create), _TIMEOUT_S)
        answer = await asyncio.wait_for(create.done, _TIMEOUT_S)
        transport.close()
        status, body = _body(answer)
        if " 201 " not in f"{status} ":
            raise CouldNotRunError(f"the engine at {address.endpoint} refused an exec in "
                                   f"{container[:12]}: {status} "
                                   f"{body[:300].decode('utf-8', 'replace').strip()}",
                                   retryable=True)
        exec_id = str(json.loads(body)["Id"])
        start = _AttachProtocol(channel, _request(
            address, f"{prefix}/exec/{exec_id}/start", {"Detach": False, "Tty": False},
            upgrade=True))
        await asyncio.wait_for(_connect(address, start), _TIMEOUT_S)
        await asyncio.wait_for(start.upgraded, _TIMEOUT_S)
    except (OSError, TimeoutError, ssl.SSLError, ValueError, KeyError) as exc:
        raise CouldNotRunError(f"could not reach the sandbox agent through an exec on "
                               f"{address.endpoint}: {exc or 'timed out'}", retryable=True
                               ) from None
