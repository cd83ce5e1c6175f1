"""What the model reads about egress (issue 33, items 4 and 5), on the host backend and podman.

* A refused connection: the client prints only ``403``; the model's text (Toolkit, the CLI's
  ``--model-text``, MCP, ``serve --stdio``) ends with one line per refused host naming the
  reason and the setting that would allow it.
* A TLS-inspecting network: an upstream whose CA is only in a named bundle (as a gateway's CA is
  only in the host's store). Without ``egress_trust_host_cas`` the sandbox's client fails and the
  model is told the setting; with it the same client succeeds.

Every upstream is a real server on 127.0.0.1, reached by names pinned with ``egress_resolve``.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from toolseam import Toolkit
from toolseam.frontends.mcp.server import result_to_mcp
from toolseam.policy.limits import SandboxLimits

from ..support.egress_servers import Seen, UpstreamCA, make_test_ca, web_server
from ..support.engines import backend, remove_shared, shared_dir

BACKENDS = ("host", "podman")
CLIENT = Path(__file__).parents[1] / "support" / "egress_client.py"


@pytest.fixture(scope="module")
def gateway_ca(tmp_path_factory: pytest.TempPathFactory) -> UpstreamCA:
    """A CA no image and no system store trusts: the stand-in for a TLS-inspecting gateway's."""
    return make_test_ca(tmp_path_factory.mktemp("gateway") / "ca", ["inspected.test"])


@pytest.fixture(scope="module")
def ports(gateway_ca: UpstreamCA) -> Iterator[dict[str, int]]:
    with web_server(Seen()) as plain, web_server(Seen(), tls=gateway_ca) as tls:
        yield {"plain": plain, "tls": tls}


def egress_settings(ports: dict[str, int], **extra: Any) -> dict[str, Any]:
    return {"limits": {"network": "egress"},
            "egress_allow": [f"web.test:{ports['plain']}", f"inspected.test:{ports['tls']}"],
            "egress_resolve": {"web.test": "127.0.0.1", "other.test": "127.0.0.1",
                               "inspected.test": "127.0.0.1"},
            "egress_private": True, **extra}


async def run_client(name: str, settings: dict[str, Any], *urls: str) -> list[tuple[str, str]]:
    """Each ``egress_client.py get URL`` through a fresh egress session on ``name``: its
    output and its model text."""
    host_dir = shared_dir()
    try:
        if name == "host":
            tk = Toolkit("host", base_dir=host_dir, settings=settings)
        else:
            tk = Toolkit(backend(name, str(host_dir), limits=SandboxLimits(network="egress")),
                         settings=settings)
        python = sys.executable if name == "host" else "python3"
        async with tk:
            await tk.call("write", {"path": "egress_client.py", "content": CLIENT.read_text()})
            answers = []
            for url in urls:
                result = await tk.call("bash", {"command": f"{python} egress_client.py get "
                                                           f"{shlex.quote(json.dumps({'url': url}))}"})
                answers.append((result.output, result.model_text()))
                # MCP shows the model exactly the same text.
                assert result_to_mcp(result).content[0].text == result.model_text()  # type: ignore[union-attr]
            return answers
    finally:
        remove_shared(host_dir)


@pytest.mark.asyncio
@pytest.mark.parametrize("name", BACKENDS)
async def test_a_refused_host_is_named_with_its_reason_and_setting(
        name: str, ports: dict[str, int]) -> None:
    private = {**egress_settings(ports), "egress_private": False}
    (refused, _), = await run_client(name, egress_settings(ports), "https://other.test:443/")
    (tunnel_output, tunnel_text), = await run_client(name, private,
                                                     f"http://web.test:{ports['plain']}/")
    assert "other.test:443" not in refused  # the client saw a 403 and nothing more
    assert _.endswith('[egress: refused other.test:443: not in egress_allow — to allow it, set '
                      'egress_allow = ["other.test:443"]]'), _
    assert tunnel_text.startswith(tunnel_output.rstrip("\n"))
    assert tunnel_text.endswith(
        f"[egress: refused web.test:{ports['plain']}: resolves to 127.0.0.1, a loopback address — "
        "to allow it, set egress_private = true (only for a host meant to be private)]"), tunnel_text


@pytest.mark.asyncio
async def test_the_refusal_line_stays_within_a_small_budget(ports: dict[str, int]) -> None:
    host_dir = shared_dir()
    try:
        async with Toolkit("host", base_dir=host_dir, settings={
                **egress_settings(ports), "model_output_chars": 1000}) as tk:
            await tk.call("write", {"path": "egress_client.py", "content": CLIENT.read_text()})
            result = await tk.call("bash", {"command": "seq 1 50000; " + shlex.join(
                [sys.executable, "egress_client.py", "get", json.dumps({"url": "http://other.test/"})])})
            text = result.model_text()
            assert len(text) <= 1000 and "omitted" in text and text.endswith(
                "[egress: refused other.test:80: not in egress_allow — to allow it, set "
                'egress_allow = ["other.test:80"]]')
    finally:
        remove_shared(host_dir)


# What a command asks the proxy for is its own choice: a CONNECT to a name no host has.
HOSTILE_CONNECTS = r'''
import os, socket, sys, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
for target in sys.argv[1:]:
    with socket.create_connection((proxy.hostname, proxy.port)) as s:
        s.sendall(("CONNECT %s HTTP/1.1\r\n\r\n" % target).encode())
        s.recv(100)
'''


@pytest.mark.asyncio
async def test_a_hostile_host_name_is_shown_escaped_short_and_with_no_fix(
        ports: dict[str, int]) -> None:
    host_dir = shared_dir()
    try:
        async with Toolkit("host", base_dir=host_dir, settings=egress_settings(ports)) as tk:
            await tk.call("write", {"path": "connects.py", "content": HOSTILE_CONNECTS})
            # a dash that reads as ours, a right-to-left override (the proxy reads the request
            # line as Latin-1: its bytes come escaped), a flood
            targets = ["ok.test—to-allow-it:443", "evil\u202etset.test:443", "a" * 300 + ":443"]
            result = await tk.call("bash", {"command": shlex.join(
                [sys.executable, "connects.py", *targets])})
            notes = [line for line in result.model_text().splitlines()
                     if line.startswith("[egress:")]
    finally:
        remove_shared(host_dir)
    assert len(notes) == 3, notes
    for note in notes:
        assert note.isascii() and len(note) < 120 and "to allow it" not in note, note
        assert note.endswith(": not a valid host name]"), note
    assert notes[1] == r"[egress: refused 'evil\xe2\x80\xaetset.test':443: not a valid host name]"
    assert notes[2] == f"[egress: refused '{'a' * 40}'...:443: not a valid host name]"


def test_the_cli_model_text_names_the_refusal(tmp_path: Path, ports: dict[str, int]) -> None:
    config = tmp_path / "settings.json"
    config.write_text(json.dumps(egress_settings(ports)))
    host_dir = shared_dir()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "toolseam", "call", "bash",
             json.dumps({"command": f"{sys.executable} -c 'import urllib.request as u; "
                                    "u.urlopen(\"http://other.test:81/\")'"}),
             "--base-dir", str(host_dir), "--config", str(config), "--model-text"],
            capture_output=True, text=True, timeout=120)
    finally:
        remove_shared(host_dir)
    assert done.returncode == 1, done.stderr  # the command failed: urlopen raised
    assert ('[egress: refused other.test:81: not in egress_allow — to allow it, set '
            'egress_allow = ["other.test:81"]]') in done.stdout, done.stdout


def test_stdio_model_text_names_the_refusal(tmp_path: Path, ports: dict[str, int]) -> None:
    """``serve --stdio``'s ``model_text`` carries the same line (EOF ends the server)."""
    config = tmp_path / "settings.json"
    config.write_text(json.dumps(egress_settings(ports)))
    request = {"id": 1, "tool": "bash", "args": {
        "command": f"{sys.executable} -c 'import urllib.request as u; "
                   "u.urlopen(\"http://other.test:82/\")'"}}
    host_dir = shared_dir()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "toolseam", "serve", "--stdio", "--base-dir", str(host_dir),
             "--config", str(config)], input=json.dumps(request) + "\n",
            capture_output=True, text=True, timeout=120)
    finally:
        remove_shared(host_dir)
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    (answer,) = [a for a in answers if a.get("id") == 1]
    assert answer["result"]["model_text"].endswith(
        '[egress: refused other.test:82: not in egress_allow — to allow it, set '
        'egress_allow = ["other.test:82"]]'), answer


@pytest.mark.asyncio
@pytest.mark.parametrize("name", BACKENDS)
async def test_a_gateway_ca_is_trusted_inside_only_with_the_setting(
        name: str, ports: dict[str, int], gateway_ca: UpstreamCA) -> None:
    url = f"https://inspected.test:{ports['tls']}/through"
    named = {"egress_ca_file": str(gateway_ca.ca_file)}
    (failed, failed_text), = await run_client(name, egress_settings(ports, **named), url)
    assert "CERTIFICATE_VERIFY_FAILED" in failed, failed
    assert "set egress_trust_host_cas = true" in failed_text, failed_text
    (passed, _), = await run_client(
        name, egress_settings(ports, egress_trust_host_cas=True, **named), url)
    answer = json.loads(passed.strip().splitlines()[-1])
    assert answer["status"] == 200 and '"path": "/through"' in answer["body"], answer


def test_a_ca_file_that_is_no_pem_bundle_is_refused_naming_it(tmp_path: Path) -> None:
    """Said when the settings are made, not as a bare ``SSLError`` when the sandbox opens."""
    from toolseam import ConfigurationError, Settings

    garbage = tmp_path / "gateway.pem"
    garbage.write_text("not a certificate\n")
    with pytest.raises(ConfigurationError, match=f"egress_ca_file = '{garbage}': not a PEM "
                                                 "bundle of CA certificates"):
        Settings(limits=SandboxLimits(network="egress"), egress_ca_file=str(garbage),
                 egress_trust_host_cas=True)
