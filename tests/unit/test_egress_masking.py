"""What an upstream answers to a request that carried a credential is masked before the
sandbox sees it (toolseam/egress/masking.py): the stream filter as a property, and the relay
against raw upstreams that echo the request (Content-Length, chunked cut mid-value, a status
line, a header, TRACE, a compressed answer)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from toolseam.egress import EgressPolicy, EgressProxy
from toolseam.egress.masking import Masker

from ..support.egress_proxy import raw_request, running

SECRET = "Bearer s3cret-t0ken-value"
TOKEN = SECRET.split()[-1]


@given(st.binary(max_size=200), st.lists(st.integers(0, 60), max_size=8),
       st.sampled_from([SECRET, TOKEN, json.dumps("x\"" + TOKEN)[1:-1]]))
def test_a_stream_in_any_cuts_is_masked_whole_and_keeps_its_length(
        noise: bytes, cuts: list[int], secret_form: str) -> None:
    stream = noise[:50] + secret_form.encode() + noise[50:] + SECRET.encode()
    masker = Masker([SECRET])
    out, at = b"", 0
    for cut in sorted(cuts):
        out += masker.feed(stream[at:max(at, cut)])
        at = max(at, cut)
    out += masker.feed(stream[at:]) + masker.flush()
    assert len(out) == len(stream)
    assert out == Masker([SECRET]).mask(stream)
    assert TOKEN.encode() not in out


def _policy(port: int) -> EgressPolicy:
    return EgressPolicy.from_settings(
        {"egress_allow": [f"echo.test:{port}"], "egress_private": True,
         "egress_resolve": {"echo.test": "127.0.0.1"},
         "egress_credentials": [{"host": "echo.test", "header": "Authorization",
                                 "value_env": "ECHO_AUTH"}]},
        environ={"ECHO_AUTH": SECRET})


Answer = Callable[[bytes], bytes]


async def _through_proxy(answer: Answer, request_method: str = "GET") -> tuple[bytes, bytes]:
    """What the client gets, and what the upstream got, for one plain-HTTP request."""
    got: list[bytes] = []

    async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        got.append(head)
        writer.write(answer(head))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with running(EgressProxy(_policy(port))) as proxy_url:
            client = await raw_request(proxy_url, (
                f"{request_method} http://echo.test:{port}/ HTTP/1.1\r\nHost: echo.test\r\n"
                "Accept-Encoding: gzip\r\n\r\n").encode())
    finally:
        server.close()
        await server.wait_closed()
    return client, got[0] if got else b""


def _echo_length(head: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nX-Echo: " + head.split(b"\r\n")[-3] + \
        b"\r\nContent-Length: %d\r\n\r\n%s" % (len(head), head)


def _echo_chunked_cut_mid_value(head: bytes) -> bytes:
    at = head.index(TOKEN.encode()) + 5  # the value split between two chunks
    first, second = head[:at], head[at:]
    return (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(first), first, len(second), second))


def _status_quoting(head: bytes) -> bytes:
    return b"HTTP/1.1 400 " + TOKEN.encode() + b"\r\nContent-Length: 0\r\n\r\n"


def _compressed(head: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc"


async def test_an_echoed_credential_is_masked_in_headers_and_body() -> None:
    client, upstream_got = await _through_proxy(_echo_length)
    assert SECRET.encode() in upstream_got  # the upstream did get it
    assert b"Accept-Encoding: identity" in upstream_got and b"gzip" not in upstream_got
    assert client.startswith(b"HTTP/1.1 200 OK\r\n")
    assert TOKEN.encode() not in client and b"*" * len(SECRET) in client
    head, body = client.split(b"\r\n\r\n", 1)
    assert b"Content-Length: %d" % len(body) in head  # the same length: framing still true


async def test_a_chunked_echo_cut_inside_the_value_is_masked_and_rechunked() -> None:
    client, _ = await _through_proxy(_echo_chunked_cut_mid_value)
    head, body = client.split(b"\r\n\r\n", 1)
    assert b"Transfer-Encoding: chunked" in head
    decoded, rest = b"", body
    while True:
        size_line, rest = rest.split(b"\r\n", 1)
        size = int(size_line, 16)
        if size == 0:
            break
        decoded, rest = decoded + rest[:size], rest[size + 2:]
    assert TOKEN.encode() not in decoded and b"*" * len(SECRET) in decoded
    assert decoded.startswith(b"GET / HTTP/1.1\r\n")


async def test_a_status_line_quoting_the_token_is_masked() -> None:
    client, _ = await _through_proxy(_status_quoting)
    assert client.startswith(b"HTTP/1.1 400 " + b"*" * len(TOKEN) + b"\r\n")


async def test_trace_to_a_credential_host_is_refused_before_it_leaves() -> None:
    client, upstream_got = await _through_proxy(_echo_length, "TRACE")
    assert upstream_got == b""
    assert client.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert b"TRACE is refused to echo.test" in client


async def test_a_compressed_answer_to_a_credentialed_request_is_refused() -> None:
    client, _ = await _through_proxy(_compressed)
    assert client.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert b"Content-Encoding 'gzip'" in client and b"abc" not in client


