"""The gateway-CA hint does not depend on when a tunnel's event is recorded (issue 45).

A CONNECT's audit event is written when its tunnel closes, which can be after the call that
made it has its result; the hint ("set egress_trust_host_cas = true") used to look for that
event only, so a slow proxy loop lost it. Here the tunnel is held open while the call's notes
are made — the late-event order, every time."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator

import pytest

from toolseam.egress import EgressPolicy, EgressProxy
from toolseam.egress.session import SessionEgress

from ..support.egress_proxy import running
from ..support.egress_servers import Seen, UpstreamCA, make_test_ca, web_server


@pytest.fixture
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    ca: UpstreamCA = make_test_ca(tmp_path_factory.mktemp("ca"), ["secure.test"])
    with web_server(Seen(), tls=ca) as port:
        yield port


async def test_the_gateway_ca_hint_comes_while_the_tunnel_is_still_open(secure: int) -> None:
    policy = EgressPolicy.from_settings({"egress_allow": [f"secure.test:{secure}"],
                                         "egress_private": True,
                                         "egress_resolve": {"secure.test": "127.0.0.1"}})
    proxy = EgressProxy(policy)
    egress = SessionEgress(proxy, {})
    async with running(proxy) as proxy_url:
        mark = egress.mark()  # the call begins
        host, port = proxy_url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"CONNECT secure.test:{secure} HTTP/1.1\r\n\r\n".encode())
        assert b" 200 " in await reader.readuntil(b"\r\n\r\n")
        # The client trusts the system's CAs only: the test CA's certificate fails, as a
        # TLS-inspecting gateway's would.
        with pytest.raises(ssl.SSLCertVerificationError) as failed:
            await writer.start_tls(ssl.create_default_context(), server_hostname="secure.test")
        output = f"curl: {failed.value}"
        made = egress.since(mark)
        assert made == []  # the tunnel is open: its event is not recorded yet
        notes = egress.notes(made, output, mark)  # before the fix: no hint without the event
        assert any("set egress_trust_host_cas = true" in note for note in notes), notes
        writer.close()
    assert [(e["kind"], e["allowed"]) for e in egress.since(mark)] == [("connect", True)]
    later = egress.mark()
    assert egress.notes([], output, later) == []  # a later call made no tunnel: no hint
