"""Egress mode for a session on a Ray node (``toolseam/ray/egress.py``, and the remote
backend's over Ray, ``backends/remote/egress.py``): the sandbox on the node
has loopback alone; its proxy clients reach the allowed host through this process's proxy (the
rules and the audit stay with the caller), a refused host is a 403 in the caller's log and the
model's text, a peer without the session's egress token gets nothing, and close leaves nothing.
The upstream is a real server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from toolseam import Toolkit
from toolseam.policy.limits import SandboxLimits
from toolseam.ray import RayBackend

from ..support.egress_servers import serve, static_handler
from ..support.ray_cluster import RAY_TESTS, RayTestCluster, assert_node_empty, resource

pytestmark = RAY_TESTS

FETCH = ("import sys, urllib.request, urllib.error\n"
         "try:\n"
         "    body = urllib.request.urlopen(sys.argv[1], timeout=30).read().decode()\n"
         "    print('200', body)\n"
         "except urllib.error.HTTPError as error:\n"
         "    print(error.code, error.read().decode()[:200])\n")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    root = tmp_path_factory.mktemp("upstream")
    (root / "hello.txt").write_text("hello from the upstream\n")
    with serve(static_handler(root)) as port:
        yield port


def egress_settings(upstream: int) -> dict[str, object]:
    """The toolkit's settings of these tests: web.test allowed, other.test not, both the
    upstream on 127.0.0.1."""
    return {"limits": {"network": "egress"}, "egress_allow": [f"web.test:{upstream}"],
            "egress_resolve": {"web.test": "127.0.0.1", "other.test": "127.0.0.1"},
            "egress_private": True}


@pytest.mark.parametrize("node", ["rootless", "docker"])
async def test_a_ray_session_in_egress_mode_reaches_only_the_allowed_host(
        ray_cluster: RayTestCluster, upstream: int, node: str) -> None:
    settings = egress_settings(upstream)
    backend = RayBackend(resources=resource(node), address=ray_cluster.address,
                         limits=SandboxLimits(network="egress"))
    async with Toolkit(backend, settings=settings) as tk:
        assert (await tk.call("write", {"path": "fetch.py", "content": FETCH})).is_error is False
        allowed = await tk.call("bash", {"command": f"python3 fetch.py http://web.test:{upstream}/hello.txt"})
        assert allowed.output.startswith("200 hello from the upstream"), allowed.output
        refused = await tk.call("bash", {"command": f"python3 fetch.py http://other.test:{upstream}/"})
        assert refused.output.startswith("403"), refused.output
        # the model reads why, with the setting that would allow it
        assert any(note.startswith("[egress: refused other.test") and "egress_allow" in note
                   for note in refused.model_hints.notes), refused.model_hints.notes
        log = tk.egress_log()
        assert [(e.host, e.allowed, e.status) for e in log] == [
            ("web.test", True, 200), ("other.test", False, 403)]
        assert log[0].job is not None  # attributed here, though it was opened on the node
        # no way around the proxy: the sandbox on the node has loopback alone
        direct = await tk.call("bash", {"command": (
            "python3 -c \"import socket; s=socket.socket(); s.settimeout(3); "
            f"print(s.connect_ex(('127.0.0.1', {upstream})))\"")})
        assert direct.output.strip() != "0", direct.output
    await assert_node_empty(ray_cluster, node)
