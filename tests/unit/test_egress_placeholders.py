"""Placeholder credentials and the captured-connection resolver, without an engine: the shape
of a placeholder, the swap in a stream cut anywhere, the proxy swapping for the bound host and
refusing elsewhere (a real proxy on 127.0.0.1, real upstreams), the ports a name is granted,
and the DNS messages the sandbox's resolver reads and writes."""

from __future__ import annotations

import asyncio
import json
import socket
import string
import struct
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from toolseam.egress import EgressPolicy, EgressProxy
from toolseam.egress.placeholders import Scanner, Swapper, shaped_like
from toolseam_agent.resolver import Capture, answer, parse_query

from ..support.egress_servers import Seen, web_server

TOKEN = "ghp_" + "Ab3dE" * 7 + "x"  # GitHub's shape: ghp_ and 36 of [A-Za-z0-9]


def policy(allow: list[str], **extra: object) -> EgressPolicy:
    return EgressPolicy.from_settings(
        {"egress_allow": allow, "egress_private": True,
         "egress_resolve": {"api.test": "127.0.0.1", "other.test": "127.0.0.1"},
         "egress_credentials": [{"host": "api.test", "header": "Authorization",
                                 "value_env": "REAL", "placeholder_env": "GITHUB_TOKEN",
                                 "placeholder_in": ["header", "url", "body"]}], **extra},
        environ={"REAL": TOKEN})


# -- the shape ---------------------------------------------------------------------------------
@settings(deadline=None)  # a loaded 2-CPU machine: timing is not the property
@given(st.text(alphabet=string.ascii_letters + string.digits + "_-.", min_size=8, max_size=80))
@example("a_______")  # a prefix, then punctuation alone: once a loop that never ended
@example("--------")
def test_a_placeholder_keeps_the_values_shape_and_never_equals_it(value: str) -> None:
    if not any(ch.isalnum() for ch in value):  # nothing to change: refused, never a hang
        with pytest.raises(ValueError, match="no letter or digit"):
            shaped_like(value)
        return
    fake = shaped_like(value)
    assert fake != value and len(fake) == len(value)
    for made, real in zip(fake, value, strict=True):
        for alphabet in (string.digits, string.ascii_lowercase, string.ascii_uppercase):
            if real in alphabet:
                assert made in alphabet
                break
        else:
            assert made == real  # punctuation is kept


def test_a_known_prefix_is_kept() -> None:
    assert shaped_like(TOKEN).startswith("ghp_")
    assert shaped_like("sk-ant-api03-" + "a" * 40).startswith("sk-")
    assert shaped_like("xoxb-1234-abcd").startswith("xoxb-")


def test_the_policy_hides_the_value_and_gives_the_sandbox_the_placeholder() -> None:
    made = policy(["api.test"])
    environment = made.placeholder_environment()
    assert list(environment) == ["GITHUB_TOKEN"] and environment["GITHUB_TOKEN"] != TOKEN
    assert TOKEN not in repr(made) and TOKEN not in json.dumps(made.model_dump(mode="json"))
    assert TOKEN not in repr(made.placeholders("api.test"))
    assert made.credential_hosts() == ["api.test"]  # its TLS is terminated to swap
    assert made.credentials_for("api.test") == ()  # nothing is added: it is swapped


# -- the swap in a stream ----------------------------------------------------------------------
@settings(deadline=None)  # a loaded 2-CPU machine: timing is not the property
@given(st.binary(max_size=200), st.binary(max_size=200), st.lists(st.integers(0, 500), max_size=6))
def test_the_swap_is_the_same_wherever_the_stream_is_cut(before: bytes, after: bytes,
                                                         cuts: list[int]) -> None:
    fake = shaped_like(TOKEN)
    data = before + fake.encode() + after + fake.encode()
    swapper = Swapper([(fake, TOKEN)])
    out, start = b"", 0
    for cut in sorted({min(c, len(data)) for c in cuts}):
        out += swapper.feed(data[start:cut])
        start = cut
    out += swapper.feed(data[start:]) + swapper.flush()
    assert out == data.replace(fake.encode(), TOKEN.encode())


@settings(deadline=None)  # a loaded 2-CPU machine: timing is not the property
@given(st.integers(0, 60))
def test_a_foreign_placeholder_split_over_two_pieces_is_still_seen(cut: int) -> None:
    fake = shaped_like(TOKEN)
    data = b"x" * 20 + fake.encode() + b"y" * 20
    scanner = Scanner([fake])
    assert scanner.seen(data[:cut]) or scanner.seen(data[cut:])
    refused: list[bool] = []
    swapper = Swapper([], [fake], lambda: refused.append(True))
    passed = swapper.feed(data[:cut]) + swapper.feed(data[cut:]) + swapper.flush()
    assert refused == [True] and fake.encode() not in passed


# -- through the proxy -------------------------------------------------------------------------
@pytest.fixture
def upstream() -> Iterator[tuple[int, Seen]]:
    seen = Seen()
    with web_server(seen, secret_header="Authorization", secret=f"token {TOKEN}") as port:
        yield port, seen


@asynccontextmanager
async def running(proxy: EgressProxy) -> AsyncIterator[int]:
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        await proxy.close()
        server.close()
        await server.wait_closed()


async def request(port: int, raw: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw.encode())
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


async def test_the_placeholder_is_swapped_for_the_bound_host(upstream: tuple[int, Seen]) -> None:
    port, seen = upstream
    made = policy([f"api.test:{port}", f"other.test:{port}"])
    fake = made.placeholder_environment()["GITHUB_TOKEN"]
    proxy = EgressProxy(made)
    async with running(proxy) as proxy_port:
        answer_ = await request(proxy_port, f"GET http://api.test:{port}/private?t={fake} "
                                f"HTTP/1.1\r\nHost: api.test\r\nAuthorization: token {fake}\r\n\r\n")
    assert answer_.startswith(b"HTTP/1.1 200") and answer_.endswith(b"authorized\n"), answer_
    assert seen.paths == [f"/private?t={TOKEN}"]  # "url" is configured too
    assert TOKEN.encode() not in answer_


async def test_the_placeholder_is_refused_anywhere_else(upstream: tuple[int, Seen]) -> None:
    port, seen = upstream
    made = policy([f"api.test:{port}", f"other.test:{port}"])
    fake = made.placeholder_environment()["GITHUB_TOKEN"]
    proxy = EgressProxy(made)
    async with running(proxy) as proxy_port:
        in_header = await request(proxy_port, f"GET http://other.test:{port}/ HTTP/1.1\r\n"
                                  f"Host: other.test\r\nX-Token: {fake}\r\n\r\n")
        in_body = await request(proxy_port, f"POST http://other.test:{port}/ HTTP/1.1\r\n"
                                f"Host: other.test\r\nContent-Length: {len(fake) + 2}\r\n\r\n"
                                f"t={fake}")
    assert in_header.startswith(b"HTTP/1.1 403") and b"placeholder" in in_header
    assert not in_body.startswith(b"HTTP/1.1 200")
    assert all(fake not in json.dumps(r) for r in seen.requests)  # the body never went
    events = proxy.events()
    assert [(e.host, e.allowed, e.status) for e in events] == [
        ("other.test", False, 403), ("other.test", False, 403)]
    assert all("placeholder" in e.reason for e in events)


# -- the resolver's side of the policy ---------------------------------------------------------
def test_the_ports_a_name_is_granted() -> None:
    made = policy(["api.test", "*.corp.test:5432", "db.test:5432", "10.0.0.1:22", "ssh.test:22"])
    assert made.ports_for("api.test") == [80, 443]
    assert made.ports_for("DB.test.") == [5432]
    assert made.ports_for("pg.corp.test") == [5432]
    assert made.ports_for("corp.test") == []  # a wildcard is for names below it
    assert made.ports_for("ssh.test") == [22]
    assert made.ports_for("10.0.0.1") == []  # addresses are not names
    assert made.ports_for("nope.test") == []


def test_a_refused_name_is_audited_once() -> None:
    proxy = EgressProxy(policy(["api.test"]))
    assert proxy.ports_for("nope.test") == proxy.ports_for("nope.test") == []
    assert proxy.ports_for("api.test") == [80, 443]
    [event] = proxy.events()
    assert (event.host, event.kind, event.allowed) == ("nope.test", "dns", False)
    assert 'egress_allow = ["nope.test"]' in event.reason


# -- the DNS messages --------------------------------------------------------------------------
def query(name: str, qtype: int = 1, ident: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".") if p)
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", qtype, 1)


@settings(deadline=None)  # a loaded 2-CPU machine: timing is not the property
@given(st.lists(st.from_regex(r"[a-z0-9-]{1,20}", fullmatch=True), min_size=1, max_size=5))
def test_a_query_is_read_and_answered(labels: list[str]) -> None:
    name = ".".join(labels)
    parsed = parse_query(query(name.upper()))
    assert parsed is not None
    ident, flags, got, qtype, question = parsed
    assert (ident, got, qtype) == (0x1234, name, 1)
    reply = answer(ident, flags, question, 0, "127.100.0.7")
    assert reply[:2] == b"\x12\x34" and struct.unpack("!H", reply[6:8]) == (1,)
    assert reply.endswith(socket.inet_aton("127.100.0.7"))


@settings(deadline=None)  # a loaded 2-CPU machine: timing is not the property
@given(st.binary(max_size=80))
def test_garbage_is_never_an_error(packet: bytes) -> None:
    parse_query(packet)  # None or a query; never raises


def test_capture_gives_each_name_an_address_and_listens_on_its_ports() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    def adopt(sock: socket.socket, _name: str, _port: int) -> None:
        sock.close()

    capture = Capture(lambda name: [port] if name.endswith(".ok") else [], adopt)
    try:
        first, again, other = capture.resolve("a.ok"), capture.resolve("a.ok"), capture.resolve("b.ok")
        assert first == again and first != other and first is not None
        assert capture.resolve("refused.test") is None
        assert first.startswith("127.100.")
        assert capture.problems == []
        with socket.create_connection((first, port), timeout=5):  # its listener is there
            pass
    finally:
        capture.close()


def test_a_credential_with_no_letter_or_digit_cannot_have_a_placeholder() -> None:
    with pytest.raises(ValueError, match="no letter or digit") as raised:
        EgressPolicy.from_settings(
            {"egress_allow": ["api.test"], "egress_credentials": [
                {"host": "api.test", "header": "Authorization", "value_env": "REAL",
                 "placeholder_env": "TOKEN"}]}, environ={"REAL": "-_-_-_-_"})
    assert "-_-_-_-_" not in str(raised.value)
