"""The egress core (issue 21): policy, address checks, proxy, interception, audit — against real
servers on 127.0.0.1 and real clients (curl, git, pip, urllib, http.client).

No test resolves a name through DNS or connects anywhere but 127.0.0.1: every name is pinned
with ``egress_resolve``, and every refusal under test happens before a connect (the servers count
what reaches them to prove it).
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import ipaddress
import logging
import os
import ssl
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from toolseam.egress import EgressEvent, EgressPolicy, EgressProxy, address_class
from toolseam.egress.audit import REDACTED, Redactor
from toolseam.egress.patterns import EgressRuleError, parse_allow_rule

from ..support.egress_proxy import raw_request, running
from ..support.egress_servers import (
    Seen,
    UpstreamCA,
    closed_port,
    git_handler,
    make_bare_repo,
    make_index,
    make_test_ca,
    serve,
    static_handler,
    web_server,
)

SECRET = "Bearer tok-3c1b9e7f-never-inside"
PINS = {"web.test": "127.0.0.1", "secure.test": "127.0.0.1", "git.test": "127.0.0.1",
        "pypi.test": "127.0.0.1", "down.test": "127.0.0.1", "echo.test": "127.0.0.1",
        "other.test": "127.0.0.1"}


def policy(allow: list[str], **settings_: Any) -> EgressPolicy:
    settings_.setdefault("egress_resolve", PINS)
    return EgressPolicy.from_settings({"egress_allow": allow, **settings_},
                                      environ={"EGRESS_TEST_TOKEN": SECRET})


# Set on this machine to the system bundle; each test says what its client trusts.
_CA_VARIABLES = {"GIT_SSL_CAINFO", "CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "SSL_CERT_FILE",
                 "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS"}


def client_env(home: Path) -> dict[str, str]:
    """A client environment without any inherited proxy setting."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k not in _CA_VARIABLES}
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0",
               PIP_CONFIG_FILE=os.devnull, PIP_NO_INPUT="1")
    return env


async def run(*argv: str, env: dict[str, str], cwd: Path | None = None) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(*argv, env=env, cwd=cwd,
                                                   stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def shape(event: EgressEvent) -> dict[str, Any]:
    """An event without its timing."""
    fields = dict(vars(event))
    fields.pop("started")
    fields.pop("duration_s")
    return fields


@pytest.fixture(scope="module")
def upstream_ca(tmp_path_factory: pytest.TempPathFactory) -> UpstreamCA:
    return make_test_ca(tmp_path_factory.mktemp("ca"), ["secure.test", "git.test"])


@pytest.fixture
def seen() -> Seen:
    return Seen()


@pytest.fixture
def web(seen: Seen) -> Iterator[int]:
    with web_server(seen, secret_header="Authorization", secret=SECRET) as port:
        yield port


@pytest.fixture
def secure(seen: Seen, upstream_ca: UpstreamCA) -> Iterator[int]:
    with web_server(seen, tls=upstream_ca, secret_header="Authorization", secret=SECRET) as port:
        yield port


# -- rules -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("settings_", "named"), [
    ({"egress_allow": ["pypi.org:http"]}, "egress_allow[0] = 'pypi.org:http': port 'http'"),
    ({"egress_allow": ["ok.org", "https://x.org"]}, "egress_allow[1] = 'https://x.org'"),
    ({"egress_allow": ["*"]}, "'*' is allowed only as a whole first label"),
    ({"egress_allow": ["*.org"]}, "would match a whole top-level domain"),
    ({"egress_allow": ["bad_-.org:70000"]}, "port '70000'"),
    ({"egress_allow": ["[1.2.3.4]"]}, "is not an IPv6 address"),
    ({"egress_alow": ["pypi.org"]}, "egress_alow"),
    ({"egress_resolve": {"pypi.test": "localhost"}}, "egress_resolve['pypi.test'] = 'localhost'"),
    ({"egress_credentials": [{"host": "git.test", "header": "Authorization", "value_env": "NOPE_X"}]},
     "egress_credentials[0] (host 'git.test'): environment variable NOPE_X is not set"),
    ({"egress_credentials": [{"host": "*.git.test", "header": "A", "value_env": "X"}]}, "host name"),
    ({"egress_credentials": [{"host": "git.test", "header": "Bad Header", "value_env": "X"}]},
     "not an HTTP header name"),
    ({"egress_credentials": [{"host": "g.test", "header": "A", "value_env": "X", "valu": 1}]}, "valu"),
    ({"egress_ca_file": "/nonexistent/ca.pem"}, "egress_ca_file = '/nonexistent/ca.pem': no such file"),
    ({"max_connections": 0}, "max_connections"),
], ids=lambda value: str(value)[:40])
def test_malformed_settings_name_the_entry(settings_: dict[str, Any], named: str) -> None:
    with pytest.raises((ValidationError, EgressRuleError)) as caught:
        EgressPolicy.from_settings(settings_, environ={})
    assert named in str(caught.value)


def test_a_credential_value_never_appears_in_policy_text() -> None:
    made = policy([], egress_credentials=[
        {"host": "git.test", "header": "Authorization", "value_env": "EGRESS_TEST_TOKEN"}])
    assert made.credentials_for("GIT.test.") == (("Authorization", SECRET),)
    for text in (repr(made), str(made), made.model_dump_json(), str(made.model_dump())):
        assert SECRET not in text
    with pytest.raises(ValidationError) as caught:
        EgressPolicy.from_settings({"egress_credentials": [
            {"host": "git.test", "header": "A", "value_env": "EGRESS_TEST_TOKEN"}]},
            environ={"EGRESS_TEST_TOKEN": SECRET + "\n"})
    assert SECRET not in str(caught.value)
    assert "line break" in str(caught.value)


def test_decisions_name_the_setting_that_would_allow() -> None:
    made = policy(["pypi.org", "*.pythonhosted.org", "github.com:22", "10.1.2.3:8080", "[fd00::1]"])
    assert made.decide("PyPI.org.", 443).allowed
    assert made.decide("pypi.org", 80).allowed
    assert not made.decide("pypi.org", 8080).allowed
    assert made.decide("files.pythonhosted.org", 443).allowed
    assert not made.decide("pythonhosted.org", 443).allowed
    assert made.decide("github.com", 22).allowed and not made.decide("github.com", 443).allowed
    assert made.decide("10.1.2.3", 8080).allowed and not made.decide("10.1.2.3", 80).allowed
    assert made.decide("fd00::1", 443).allowed
    refusal = made.decide("example.net", 443)
    assert not refusal.allowed and refusal.hint == 'egress_allow = ["example.net:443"]'
    literal = made.decide("93.184.216.34", 443)
    assert "listed literally" in literal.reason
    assert literal.hint == 'egress_allow = ["93.184.216.34:443"]'
    assert made.decide("::1", 443).hint == 'egress_allow = ["[::1]:443"]'
    assert not made.decide("bad host", 80).allowed


_labels = st.lists(st.from_regex(r"[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?", fullmatch=True),
                   min_size=1, max_size=4)
_tld = st.from_regex(r"[a-z]{2,6}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(domain=_labels, tld=_tld, below=_labels, port=st.integers(1, 65535))
def test_wildcards_match_strict_subdomains_only(domain: list[str], tld: str, below: list[str],
                                                port: int) -> None:
    base = ".".join([*domain, tld])
    rule = parse_allow_rule(f"*.{base}", "egress_allow[0]")
    sub = ".".join([*below, base])
    assert rule.matches(sub, 443) and rule.matches(sub, 80)
    assert not rule.matches(base, 443)
    assert not rule.matches("x" + base, 443)  # a suffix without the dot is another domain
    assert rule.matches(sub, port) == (port in (80, 443))
    exact = parse_allow_rule(f"{base.upper()}:{port}", "egress_allow[0]")
    assert exact.matches(base, port) and not exact.matches(sub, port)
    made = policy([f"*.{base}"])
    assert made.decide(sub.upper() + ".", 443).allowed


@settings(max_examples=200, deadline=None)
@given(address=st.ip_addresses(v=4))
def test_ip_literals_are_never_matched_by_names_or_wildcards(address: ipaddress.IPv4Address) -> None:
    made = policy(["*.example.org", "example.org"])
    assert not made.decide(str(address), 443).allowed
    assert policy([str(address)]).decide(str(address), 443).allowed
    assert policy([f"[{ipaddress.IPv6Address('::ffff:' + str(address))}]"]).decide(
        str(address), 443).allowed is False


_forbidden_networks = ["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                       "169.254.0.0/16", "224.0.0.0/4", "0.0.0.0/8", "100.64.0.0/10",
                       "::1/128", "fc00::/7", "fe80::/10", "ff00::/8", "::/128"]


@settings(max_examples=400, deadline=None)
@given(network=st.sampled_from(_forbidden_networks), offset=st.integers(min_value=0),
       mapped=st.booleans())
def test_non_public_addresses_are_refused_and_so_are_their_ipv4_mapped_forms(
        network: str, offset: int, mapped: bool) -> None:
    net = ipaddress.ip_network(network)
    address: ipaddress.IPv4Address | ipaddress.IPv6Address = net[offset % net.num_addresses]
    if mapped and isinstance(address, ipaddress.IPv4Address):
        address = ipaddress.IPv6Address(f"::ffff:{address}")
    assert address_class(address) is not None
    from toolseam.egress import check_address
    assert check_address(address, policy([])) is not None
    assert check_address(address, policy([], egress_private=True)) is None


@settings(max_examples=300, deadline=None)
@given(address=st.ip_addresses())
def test_an_address_is_allowed_only_when_global(address: ipaddress.IPv4Address | ipaddress.IPv6Address
                                                ) -> None:
    inner = getattr(address, "ipv4_mapped", None) or address
    if address_class(address) is None:
        assert inner.is_global and not inner.is_multicast and not inner.is_private
    if not inner.is_global or inner.is_loopback or inner.is_link_local or inner.is_multicast:
        assert address_class(address) is not None


def test_the_metadata_address_in_every_spelling_is_refused() -> None:
    for spelling in ["169.254.169.254", "::ffff:169.254.169.254", "::ffff:a9fe:a9fe",
                     "2002:a9fe:a9fe::", "64:ff9b::a9fe:a9fe", "fd00:ec2::254"]:
        assert address_class(ipaddress.ip_address(spelling)) is not None, spelling


# -- the proxy against real servers ----------------------------------------------------------
async def test_allowed_plain_http_through_curl_and_urllib(web: int, seen: Seen, tmp_path: Path) -> None:
    proxy = EgressProxy(policy([f"web.test:{web}"], egress_private=True))
    async with running(proxy) as proxy_url:
        code, out, err = await run("curl", "-sS", "--proxy", proxy_url, "-H", "Proxy-Authorization: x",
                                   f"http://web.test:{web}/hello?q=1", env=client_env(tmp_path))
        assert code == 0, err
        assert '"path": "/hello?q=1"' in out
        assert "proxy-authorization" not in out and "proxy-connection" not in out

        def fetch() -> bytes:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": proxy_url}))
            with opener.open(f"http://web.test:{web}/via-urllib", timeout=10) as response:
                return bytes(response.read())
        assert b"/via-urllib" in await asyncio.to_thread(fetch)
    events = proxy.events()
    assert [(e.host, e.port, e.kind, e.allowed, e.status, e.address, e.intercepted) for e in events] == \
        [("web.test", web, "http", True, 200, "127.0.0.1", False)] * 2
    assert [e.reason for e in events] == [f"allowed by egress_allow 'web.test:{web}'"] * 2
    assert all(e.bytes_up > 0 and e.bytes_down > 0 for e in events)
    assert seen.paths == ["/hello?q=1", "/via-urllib"]


async def test_a_refused_host_gets_a_403_naming_the_setting(web: int, seen: Seen, tmp_path: Path) -> None:
    proxy = EgressProxy(policy([f"web.test:{web}"], egress_private=True))
    async with running(proxy) as proxy_url:
        code, out, _ = await run("curl", "-sS", "-i", "--proxy", proxy_url,
                                 f"http://other.test:{web}/", env=client_env(tmp_path))
        assert code == 0
        assert out.startswith("HTTP/1.1 403 Forbidden")
        assert f'egress_allow = ["other.test:{web}"]' in out
        assert f"refused other.test:{web}: not in egress_allow" in out
        answer = await raw_request(proxy_url, b"CONNECT other.test:443 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 403 Forbidden")
        assert b'egress_allow = ["other.test:443"]' in answer
        code, _, err = await run("curl", "-sS", "--proxy", proxy_url, "https://other.test/",
                                 env=client_env(tmp_path))
        assert code != 0 and "403" in err
    assert [(e.host, e.port, e.allowed, e.status, e.address) for e in proxy.events()] == [
        ("other.test", web, False, 403, None), ("other.test", 443, False, 403, None),
        ("other.test", 443, False, 403, None)]
    assert seen.paths == []


async def test_ip_literals_are_refused_unless_listed_literally(web: int, seen: Seen, tmp_path: Path) -> None:
    proxy = EgressProxy(policy([f"web.test:{web}"], egress_private=True))
    async with running(proxy) as proxy_url:
        for url in (f"http://127.0.0.1:{web}/", f"http://[::1]:{web}/", f"http://2130706433:{web}/"):
            _, out, _ = await run("curl", "-sS", "-i", "--proxy", proxy_url, url, env=client_env(tmp_path))
            assert "403 Forbidden" in out, url
        answer = await raw_request(proxy_url, f"CONNECT 127.0.0.1:{web} HTTP/1.1\r\n\r\n".encode())
        assert b"listed literally in egress_allow" in answer
        assert f'egress_allow = ["127.0.0.1:{web}"]'.encode() in answer
    assert seen.paths == []
    listed = EgressProxy(policy([f"127.0.0.1:{web}"], egress_private=True))
    async with running(listed) as proxy_url:
        _, out, _ = await run("curl", "-sS", "--proxy", proxy_url, f"http://127.0.0.1:{web}/lit",
                                 env=client_env(tmp_path))
        assert '"path": "/lit"' in out
    assert seen.paths == ["/lit"]


@pytest.mark.parametrize("pin", ["169.254.169.254", "::ffff:169.254.169.254", "127.0.0.1"])
async def test_a_name_pinned_to_a_non_public_address_is_refused_before_any_connect(
        pin: str, web: int, seen: Seen, tmp_path: Path) -> None:
    # Without egress_private, even the test's own 127.0.0.1 server is out of reach: proof that
    # the check runs on the resolved address before the socket is made.
    proxy = EgressProxy(policy(["meta.test", f"meta.test:{web}"],
                               egress_resolve={"meta.test": pin}))
    async with running(proxy) as proxy_url:
        port = web if pin == "127.0.0.1" else 80
        _, out, _ = await run("curl", "-sS", "-i", "--proxy", proxy_url, f"http://meta.test:{port}/",
                              env=client_env(tmp_path))
        assert "403 Forbidden" in out
        assert "egress_private = true" in out
        kind = "loopback" if pin == "127.0.0.1" else "link-local"
        assert f"a {kind}" in out
        answer = await raw_request(proxy_url, b"CONNECT meta.test:443 HTTP/1.1\r\n\r\n")
        assert b"403 Forbidden" in answer
    assert [(e.allowed, e.status, e.address) for e in proxy.events()] == [(False, 403, None)] * 2
    assert seen.paths == []


async def test_upstream_down_gives_a_502_naming_the_reason(tmp_path: Path, upstream_ca: UpstreamCA,
                                                           seen: Seen) -> None:
    down = closed_port()
    proxy = EgressProxy(policy([f"down.test:{down}"], egress_private=True))
    async with running(proxy) as proxy_url:
        _, out, _ = await run("curl", "-sS", "-i", "--proxy", proxy_url, f"http://down.test:{down}/",
                              env=client_env(tmp_path))
        assert "502 Bad Gateway" in out
        assert f"could not reach down.test:{down}: could not connect (127.0.0.1: Connection refused)" in out
        answer = await raw_request(proxy_url, f"CONNECT down.test:{down} HTTP/1.1\r\n\r\n".encode())
        assert b"502 Bad Gateway" in answer and b"Connection refused" in answer
    # Allowed by the rules; the status and reason say what happened next.
    assert [(e.allowed, e.status, e.address) for e in proxy.events()] == [(True, 502, None)] * 2
    assert all("Connection refused" in e.reason for e in proxy.events())
    # An intercepted host whose certificate the proxy cannot verify (no egress_ca_file).
    with web_server(seen, tls=upstream_ca) as port:
        proxy = EgressProxy(policy([f"secure.test:{port}"], egress_private=True, egress_credentials=[
            {"host": "secure.test", "header": "Authorization", "value_env": "EGRESS_TEST_TOKEN"}]))
        async with running(proxy) as proxy_url:
            answer = await raw_request(proxy_url, f"CONNECT secure.test:{port} HTTP/1.1\r\n\r\n".encode())
    assert b"502 Bad Gateway" in answer and b"TLS verification failed" in answer
    assert b"egress_ca_file" in answer


async def test_an_https_host_without_credentials_is_a_plain_tunnel(
        secure: int, seen: Seen, upstream_ca: UpstreamCA, tmp_path: Path) -> None:
    proxy = EgressProxy(policy([f"secure.test:{secure}"], egress_private=True))
    async with running(proxy) as proxy_url:
        # The client verifies against the TEST CA alone: it sees the server's own certificate.
        code, out, err = await run("curl", "-sS", "--cacert", str(upstream_ca.ca_file), "--proxy", proxy_url,
                                   f"https://secure.test:{secure}/tunnelled", env=client_env(tmp_path))
        assert code == 0, err
        assert '"path": "/tunnelled"' in out

        def fetch() -> bytes:
            context = ssl.create_default_context(cafile=str(upstream_ca.ca_file))
            port = int(proxy_url.rsplit(":", 1)[1])
            connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
            connection.set_tunnel("secure.test", secure)
            try:
                connection.request("GET", "/http-client")
                return connection.getresponse().read()
            finally:
                connection.close()
        assert b"/http-client" in await asyncio.to_thread(fetch)
    assert [(e.kind, e.allowed, e.status, e.intercepted) for e in proxy.events()] == \
        [("connect", True, 200, False)] * 2
    assert all("authorization" not in request for request in seen.requests)


async def test_credentials_are_injected_outside_and_never_seen_inside(
        secure: int, web: int, seen: Seen, upstream_ca: UpstreamCA, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="toolseam.egress")
    received: list[EgressEvent] = []
    proxy = EgressProxy(policy([f"secure.test:{secure}", f"web.test:{web}"], egress_private=True,
                               egress_ca_file=str(upstream_ca.ca_file), egress_credentials=[
        {"host": "secure.test", "header": "Authorization", "value_env": "EGRESS_TEST_TOKEN"},
        {"host": "web.test", "header": "Authorization", "value_env": "EGRESS_TEST_TOKEN"}]),
        on_event=received.append)
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(proxy.ca_bundle_pem([upstream_ca.ca_file.read_text()]))
    async with running(proxy) as proxy_url:
        # The client sends a forged credential of its own: it is replaced, not added to.
        code, out, err = await run("curl", "-sS", "-v", "--cacert", str(bundle), "--proxy", proxy_url,
                                   "-H", "Authorization: forged", f"https://secure.test:{secure}/private",
                                   env=client_env(tmp_path))
        assert code == 0, err
        assert out == "authorized\n"
        assert "CN=secure.test" in err and "toolseam egress session CA" in err  # intercepted
        code, out, err = await run("curl", "-sS", "-v", "--proxy", proxy_url,
                                   f"http://web.test:{web}/private", env=client_env(tmp_path))
        assert out == "authorized\n"
        # Trusting only the image's roots (not the session CA), the interception is visible.
        code, _, err = await run("curl", "-sS", "--cacert", str(upstream_ca.ca_file), "--proxy", proxy_url,
                                 f"https://secure.test:{secure}/private", env=client_env(tmp_path))
        assert code != 0 and "certificate" in err
    assert [r.get("authorization") for r in seen.requests] == [SECRET, SECRET]
    events = proxy.events()
    assert events == received
    assert [(e.kind, e.allowed, e.status, e.intercepted) for e in events] == [
        ("connect", True, 200, True), ("http", True, 200, False), ("connect", True, 200, True)]
    texts = [repr(events), bundle.read_text(), caplog.text, out, err, repr(proxy.policy)]
    assert all(SECRET not in text and "tok-3c1b9e7f" not in text for text in texts)
    assert "PRIVATE KEY" not in bundle.read_text()
    assert bundle.read_text().count("BEGIN CERTIFICATE") == 2


async def test_a_credential_goes_only_to_its_own_host(web: int, seen: Seen, tmp_path: Path) -> None:
    proxy = EgressProxy(policy([f"web.test:{web}", f"other.test:{web}"], egress_private=True,
                               egress_credentials=[{"host": "web.test", "header": "Authorization",
                                                    "value_env": "EGRESS_TEST_TOKEN"}]))
    async with running(proxy) as proxy_url:
        for host in ("other.test", "web.test", "sub.web.test"):
            await run("curl", "-sS", "--proxy", proxy_url, f"http://{host}:{web}/private",
                      env=client_env(tmp_path))
    assert [r.get("authorization") for r in seen.requests] == [None, SECRET]
    assert [e.status for e in proxy.events()] == [401, 200, 403]  # 401: the upstream, uncredentialed


@pytest.mark.parametrize("host", ["other.test", "[", ""])
async def test_a_tunnel_to_a_credential_host_serves_only_that_host(host: str, secure: int, seen: Seen,
                                                                   upstream_ca: UpstreamCA) -> None:
    proxy = EgressProxy(policy([f"secure.test:{secure}"], egress_private=True,
                               egress_ca_file=str(upstream_ca.ca_file), egress_credentials=[
        {"host": "secure.test", "header": "Authorization", "value_env": "EGRESS_TEST_TOKEN"}]))
    async with running(proxy) as proxy_url:
        port = int(proxy_url.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"CONNECT secure.test:{secure} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        context = ssl.create_default_context(cadata=proxy.ca_bundle_pem())
        await writer.start_tls(context, server_hostname="secure.test")
        writer.write(f"GET /private HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 421")
    assert seen.paths == []


async def test_git_clone_over_https_with_the_injected_credential(upstream_ca: UpstreamCA,
                                                                 tmp_path: Path) -> None:
    repo_root = tmp_path / "served"
    make_bare_repo(repo_root)
    basic = "Basic " + base64.b64encode(b"git:s3cr3t-git-pass").decode()
    env = client_env(tmp_path)
    with serve(git_handler(repo_root, "Authorization", basic), tls=upstream_ca) as port:
        url = f"https://git.test:{port}/repo.git"
        settings_ = {"egress_private": True, "egress_ca_file": str(upstream_ca.ca_file)}
        bare = EgressProxy(policy([f"git.test:{port}"], **settings_))
        async with running(bare) as proxy_url:
            code, _, err = await run("git", "-c", f"http.proxy={proxy_url}", "-c",
                                     f"http.sslCAInfo={upstream_ca.ca_file}", "clone", url,
                                     str(tmp_path / "without"), env=env)
        assert code != 0 and ("401" in err or "terminal prompts disabled" in err), err
        proxy = EgressProxy(EgressPolicy.from_settings(
            {"egress_allow": [f"git.test:{port}"], "egress_resolve": PINS, **settings_,
             "egress_credentials": [{"host": "git.test", "header": "Authorization",
                                     "value_env": "GIT_AUTH"}]}, environ={"GIT_AUTH": basic}))
        bundle = tmp_path / "bundle.pem"
        bundle.write_text(proxy.ca_bundle_pem())
        async with running(proxy) as proxy_url:
            code, out, err = await run("git", "-c", f"http.proxy={proxy_url}", "-c",
                                       f"http.sslCAInfo={bundle}", "clone", url,
                                       str(tmp_path / "with"), env=env)
    assert code == 0, (err, proxy.events())
    assert (tmp_path / "with" / "README").read_text() == "hello egress\n"
    assert basic not in out + err and "s3cr3t" not in repr(proxy.events())
    assert not (tmp_path / "with" / ".git" / "config").read_text().count("s3cr3t")
    events = proxy.events()
    assert events and all(e.intercepted and e.allowed and e.status == 200 for e in events), events


async def test_pip_download_from_a_local_index_through_the_proxy(tmp_path: Path) -> None:
    index = make_index(tmp_path / "index")
    with serve(static_handler(index)) as port:
        proxy = EgressProxy(policy([f"pypi.test:{port}"], egress_private=True))
        async with running(proxy) as proxy_url:
            code, out, err = await run(
                sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                "--disable-pip-version-check", "--index-url", f"http://pypi.test:{port}/simple",
                "--trusted-host", f"pypi.test:{port}", "--proxy", proxy_url,
                "-d", str(tmp_path / "out"), "tiny-egress", env=client_env(tmp_path))
    assert code == 0, out + err
    assert (tmp_path / "out" / "tiny_egress-1.0-py3-none-any.whl").is_file()
    hosts = {(e.host, e.port, e.allowed) for e in proxy.events()}
    assert hosts == {("pypi.test", port, True)}


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _open_tunnel(proxy_url: str, target: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", int(proxy_url.rsplit(":", 1)[1]))
    writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    answer = await reader.readuntil(b"\r\n\r\n")
    assert answer == b"HTTP/1.1 200 Connection Established\r\n\r\n", answer
    return reader, writer


async def test_audit_events_are_exact_for_a_tunnel() -> None:
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = echo.sockets[0].getsockname()[1]
    proxy = EgressProxy(policy([f"echo.test:{port}"], egress_private=True))
    async with running(proxy) as proxy_url:
        reader, writer = await _open_tunnel(proxy_url, f"echo.test:{port}")
        writer.write(b"x" * 1000)
        assert await reader.readexactly(1000) == b"x" * 1000
        writer.write(b"y" * 234)
        writer.write_eof()
        assert await reader.read() == b"y" * 234
        writer.close()
        await asyncio.sleep(0.1)
    echo.close()
    [event] = proxy.events()
    assert shape(event) == {"host": "echo.test", "port": port, "kind": "connect", "allowed": True,
                            "reason": f"allowed by egress_allow 'echo.test:{port}'", "status": 200,
                            "address": "127.0.0.1", "intercepted": False, "bytes_up": 1234,
                            "bytes_down": 1234, "pid": None, "argv": [], "job": None,
                            "call": None}  # no agent here to say who opened it
    assert 0 < event.duration_s < 10


async def test_fifty_connections_at_once(web: int, seen: Seen) -> None:
    proxy = EgressProxy(policy([f"web.test:{web}"], egress_private=True))
    async with running(proxy) as proxy_url:
        request = f"GET http://web.test:{web}/n HTTP/1.1\r\nHost: web.test\r\n\r\n".encode()
        answers = await asyncio.gather(*(raw_request(proxy_url, request) for _ in range(50)))
    assert all(a.startswith(b"HTTP/1.1 200") or a.startswith(b"HTTP/1.0 200") for a in answers)
    assert len(proxy.events()) == 50 and len(seen.paths) == 50
    assert proxy.active_connections == 0


async def test_over_max_connections_gets_a_503_naming_the_setting() -> None:
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = echo.sockets[0].getsockname()[1]
    proxy = EgressProxy(policy([f"echo.test:{port}"], egress_private=True, max_connections=5))
    async with running(proxy) as proxy_url:
        held = [await _open_tunnel(proxy_url, f"echo.test:{port}") for _ in range(5)]
        answer = await raw_request(proxy_url, f"CONNECT echo.test:{port} HTTP/1.1\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 503")
        assert b"egress_max_connections = 5" in answer
        for _, writer in held:
            writer.close()
    echo.close()
    assert [e.status for e in proxy.events()].count(503) == 1


async def test_close_ends_every_tunnel_and_refuses_new_ones() -> None:
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = echo.sockets[0].getsockname()[1]
    proxy = EgressProxy(policy([f"echo.test:{port}"], egress_private=True))
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    proxy_url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    tunnels = [await _open_tunnel(proxy_url, f"echo.test:{port}") for _ in range(3)]
    assert proxy.active_connections == 3
    await asyncio.wait_for(proxy.close(), 5)
    for reader, writer in tunnels:
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    assert proxy.active_connections == 0
    answer = await raw_request(proxy_url, f"CONNECT echo.test:{port} HTTP/1.1\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 503") and b"closed" in answer
    assert all("ended: the proxy was closed" in e.reason for e in proxy.events()[:3])
    server.close()
    echo.close()


async def test_an_idle_tunnel_is_closed_after_idle_timeout() -> None:
    echo = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = echo.sockets[0].getsockname()[1]
    proxy = EgressProxy(policy([f"echo.test:{port}"], egress_private=True, idle_timeout_s=0.3))
    async with running(proxy) as proxy_url:
        reader, writer = await _open_tunnel(proxy_url, f"echo.test:{port}")
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
    echo.close()
    [event] = proxy.events()
    assert "egress_idle_timeout_s = 0.3" in event.reason and event.bytes_up == 4


async def test_one_request_per_connection_and_no_smuggled_second_request(web: int, seen: Seen) -> None:
    proxy = EgressProxy(policy([f"web.test:{web}"], egress_private=True))
    async with running(proxy) as proxy_url:
        pipelined = (f"POST http://web.test:{web}/first HTTP/1.1\r\nHost: web.test\r\n"
                     f"Content-Length: 5\r\n\r\nhello"
                     f"GET http://other.test:{web}/second HTTP/1.1\r\nHost: other.test\r\n\r\n").encode()
        answer = await raw_request(proxy_url, pipelined)
        assert b"got 5 bytes" in answer
        both = (f"POST http://web.test:{web}/x HTTP/1.1\r\nContent-Length: 3\r\n"
                "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n").encode()
        assert (await raw_request(proxy_url, both)).startswith(b"HTTP/1.1 400")
    assert seen.paths == ["/first"]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_request_bodies_pass_in_their_framing_with_100_continue(
        chunked: bool, web: int, seen: Seen, tmp_path: Path) -> None:
    payload = tmp_path / "payload"
    payload.write_bytes(os.urandom(3 * 1024 * 1024))  # curl asks "Expect: 100-continue" above 1 MiB
    proxy = EgressProxy(policy([f"web.test:{web}"], egress_private=True))
    extra = ["-H", "Transfer-Encoding: chunked"] if chunked else []
    async with running(proxy) as proxy_url:
        code, out, err = await run("curl", "-sS", "-v", "--proxy", proxy_url, *extra, "--data-binary",
                                   f"@{payload}", f"http://web.test:{web}/upload", env=client_env(tmp_path))
    assert code == 0, err
    assert out == f"got {3 * 1024 * 1024} bytes"
    assert "Expect: 100-continue" in err and "HTTP/1.1 100 Continue" in err
    [event] = proxy.events()
    assert event.bytes_up > 3 * 1024 * 1024 and event.status == 200


async def _raw_upstream(answer: bytes) -> asyncio.Server:
    """An upstream that reads one request head, writes ``answer`` and closes."""
    async def serve_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        writer.close()
    return await asyncio.start_server(serve_one, "127.0.0.1", 0)


async def test_a_response_cut_short_ends_the_connection_without_a_proxy_error_inside() -> None:
    upstream = await _raw_upstream(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
    port = upstream.sockets[0].getsockname()[1]
    proxy = EgressProxy(policy([f"web.test:{port}"], egress_private=True))
    async with running(proxy) as proxy_url:
        answer = await raw_request(proxy_url, f"GET http://web.test:{port}/ HTTP/1.1\r\n\r\n".encode())
    upstream.close()
    assert answer.endswith(b"\r\n\r\n0123456789")  # what arrived, and nothing of the proxy's
    assert b"toolseam" not in answer and answer.count(b"HTTP/1.1") == 1
    [event] = proxy.events()
    assert event.status == 200 and "ended: bad request: the body ended before its Content-Length" \
        in event.reason


async def test_a_chunked_response_and_hop_by_hop_headers() -> None:
    body = b"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
    upstream = await _raw_upstream(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                                   b"Connection: keep-alive, X-Private\r\nX-Private: 1\r\n"
                                   b"Keep-Alive: timeout=5\r\nX-Kept: 2\r\n\r\n" + body + b"JUNK")
    port = upstream.sockets[0].getsockname()[1]
    proxy = EgressProxy(policy([f"web.test:{port}"], egress_private=True))
    async with running(proxy) as proxy_url:
        answer = await raw_request(proxy_url, f"GET http://web.test:{port}/ HTTP/1.1\r\n\r\n".encode())
    upstream.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert rest == body  # relayed in its framing; what followed it was not
    assert b"X-Kept: 2" in head and b"Connection: close" in head
    assert b"X-Private" not in head and b"Keep-Alive" not in head


def test_the_egress_package_exports_exactly_its_all() -> None:
    import importlib

    import toolseam.egress as egress
    assert all(hasattr(egress, name) for name in egress.__all__)
    public = {n for n in dir(egress) if not n.startswith("_")
              and not isinstance(getattr(egress, n), type(importlib))}
    assert public - set(egress.__all__) - {"annotations"} == set()


async def _serve_bytes(proxy: EgressProxy, data: bytes) -> bytes:
    """``data`` into ``handle`` over a socketpair (any stream pair will do); the answer back."""
    import socket

    inside, outside = socket.socketpair()
    proxy_reader, proxy_writer = await asyncio.open_connection(sock=inside)
    reader, writer = await asyncio.open_connection(sock=outside)
    writer.write(data)
    writer.write_eof()
    await asyncio.wait_for(proxy.handle(proxy_reader, proxy_writer), 5)
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


_methods = st.sampled_from(["GET", "CONNECT", "POST", "get", "", "HEAD"])
_targets = st.one_of(st.text(max_size=40), st.sampled_from(
    ["http://web.test/", "web.test:443", "http://127.0.0.1/", "[::1]:443", "http://a@b/",
     "https://web.test/", "http://web.test:99999/", "http://[fe80::1%25eth0]/", ":443", "/"]))
_heads = st.builds(lambda m, t, v, h: f"{m} {t} {v}\r\n{h}\r\n".encode("utf-8", "surrogatepass"),
                   _methods, _targets, st.sampled_from(["HTTP/1.1", "HTTP/1.0", "HTTP/2", ""]),
                   st.text(max_size=60))


@settings(max_examples=150, deadline=None)
@given(data=st.one_of(st.binary(max_size=200), _heads,
                      _heads.map(lambda head: head + b"\r\n")))
def test_any_request_bytes_end_in_a_refusal_and_never_a_connect(data: bytes) -> None:
    # Nothing is allowed, so whatever the bytes, no upstream may be reached and handle returns.
    proxy = EgressProxy(policy([], egress_resolve={}))
    answer = asyncio.run(_serve_bytes(proxy, data))
    assert answer == b"" or answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 403 ")), answer[:80]
    assert all(e.address is None and e.bytes_up == 0 for e in proxy.events())
    assert proxy.active_connections == 0


async def test_an_oversized_or_cut_head_is_a_400() -> None:
    proxy = EgressProxy(policy([]))
    long = b"GET http://web.test/ HTTP/1.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    assert (await _serve_bytes(proxy, long)).startswith(b"HTTP/1.1 400 ")
    cut = await _serve_bytes(proxy, b"GET http://web.test/ HTTP/1.1\r\nHost: x")
    assert cut.startswith(b"HTTP/1.1 400 ") and b"ended inside a request head" in cut


def test_the_redactor_replaces_every_value() -> None:
    redactor = Redactor(["abc", "abcdef"])
    assert redactor.scrub("x abcdef y abc") == f"x {REDACTED} y {REDACTED}"
