"""Egress with the other session features. A pooled sandbox made for egress serves it from
hand-out. And in a session that outlives its client: after a detach, the process that attaches runs
the proxy (credentials from its own environment), the sandbox's listener and its port stay, and
the CA bundle is rewritten in place for the new session CA — an HTTPS host with credentials
answers before and after, on every backend (remote engines: copy mode, the proxy here)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam import SandboxLimits, SandboxPool, Toolkit
from toolseam.seam.lifetime import Durable

from ..support.egress_servers import Seen, UpstreamCA, make_test_ca, web_server
from ..support.engines import ENGINES, EVERY_BACKEND, backend
from ..support.sessions import attach_options

SECRET = "Bearer durable-egress-t0ken"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, UpstreamCA]]:
    ca = make_test_ca(tmp_path_factory.mktemp("ca"), ["secure.test"])
    with web_server(Seen(), tls=ca, secret_header="Authorization", secret=SECRET) as port:
        yield port, ca


def _fetch(url: str) -> str:
    return (f"python3 -c 'import urllib.request as u; print(u.urlopen(\"{url}\").read().decode(), "
            "end=\"\")'")


@pytest.mark.parametrize("engine", EVERY_BACKEND)
async def test_egress_goes_on_after_an_attach(engine: str, workspace: Path,
                                              upstream: tuple[int, UpstreamCA],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    port, ca = upstream
    monkeypatch.setenv("DURABLE_EGRESS_AUTH", SECRET)
    settings = {"orphan_timeout_s": 30, "limits": {"network": "egress"},
                "egress_allow": [f"secure.test:{port}"], "egress_private": True,
                "egress_resolve": {"secure.test": "127.0.0.1"}, "egress_ca_file": str(ca.ca_file),
                "egress_credentials": [{"host": "secure.test", "header": "Authorization",
                                        "value_env": "DURABLE_EGRESS_AUTH"}]}
    chosen = "host" if engine == "host" else backend(engine, str(workspace),
                                                    limits=SandboxLimits(network="egress"),
                                                    lifetime=Durable(orphan_timeout_s=30))
    url = f"https://secure.test:{port}/private"
    tools = Toolkit(chosen, base_dir=str(workspace) if engine == "host" else None,
                    settings=settings)
    await tools.open()
    try:
        before = await tools.call("bash", {"command": _fetch(url)})
        assert before.output == "authorized\n", before.output
        bundle = tools.services.command_env["SSL_CERT_FILE"]
        handle = tools.handle
        assert handle.network == "egress"
        await tools.detach()
    except BaseException:
        await tools.close()
        raise
    attached = await Toolkit.attach(handle.to_json(), **attach_options(engine))
    try:
        after = await attached.call("bash", {"command": _fetch(url) + "; grep -c BEGIN "
                                             + bundle})
        assert attached.services.command_env["SSL_CERT_FILE"] == bundle  # the same file
        assert [(e.host, e.status) for e in attached.egress_log()] == [("secure.test", 200)]
    finally:
        await attached.close()
    first, count = after.output.splitlines()
    assert first == "authorized" and int(count) >= 1


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_pooled_sandbox_serves_egress(engine: str, workspace: Path,
                                              upstream: tuple[int, UpstreamCA],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool made with network 'egress' hands out sandboxes that have loopback alone; the
    session's proxy starts at hand-out like on a fresh open."""
    port, ca = upstream
    monkeypatch.setenv("DURABLE_EGRESS_AUTH", SECRET)
    made = backend(engine, str(workspace))  # the engine's class and endpoint, as the suite has it
    options = {"image": made.options.image, "endpoint": made.sandbox.engine.endpoint,
               "limits": SandboxLimits(network="egress")}
    if engine == "podman-rootless":
        options["rootless"] = True
    settings = {"limits": {"network": "egress"}, "egress_allow": [f"secure.test:{port}"],
                "egress_private": True, "egress_resolve": {"secure.test": "127.0.0.1"},
                "egress_ca_file": str(ca.ca_file),
                "egress_credentials": [{"host": "secure.test", "header": "Authorization",
                                        "value_env": "DURABLE_EGRESS_AUTH"}]}
    async with SandboxPool(type(made), size=1, **options) as pool:
        tools = await pool.toolkit(str(workspace), settings=settings)
        try:
            seen = await tools.call("bash", {"command": _fetch(f"https://secure.test:{port}/private")
                                             + "; cat /proc/net/dev | tail -n +3 | cut -d: -f1"})
        finally:
            await tools.close()
    assert seen.output.split() == ["authorized", "lo"]
