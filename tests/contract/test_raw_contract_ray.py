"""The raw sandbox API's contract (``Toolkit.sandbox``: argv exec with stdin, cwd, env, user,
timeout, output limits; whole-file bytes) through the session's Ray cluster, on the rootless
podman node (the default engine of a Ray node). Its ``exec`` is an ``ExecRequest`` the node's
codec takes on the direct connection as on Ray calls (issue 44, decision 336); containers drop
every capability, so another user is refused clearly, as on the local engines."""

from __future__ import annotations

from ..support.ray_cluster import RAY_TESTS
from ..support.ray_contract import RayRawBinding

pytestmark = RAY_TESTS


class TestRayRootlessRaw(RayRawBinding):
    node = "rootless"
