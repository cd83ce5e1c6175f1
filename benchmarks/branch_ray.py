"""``fork(N)`` of a session on a three-node Ray cluster (issue 48), ``benchmarks/branch.py --ray``.

A cluster of its own on 127.0.0.1 (as ``tests/support/ray_cluster.py`` makes the suite's:
a head and two more raylets, one CPU each, no dashboard), every node offering the same
resource and hosting podman — rootful on the first and third, rootless on the second (this
machine has one rootful podman: two nodes share it, each a raylet of its own) — so
``RemoteBackend(transport=RayTransport(Placement(...)))`` spreads the parent and each child
over the three (decision 446: a remote fork's child is a new session wherever the transport
places it). Measured: the first snapshot (it lands in this process's store), then ``fork(N)``
from the call until every child answered its first ``bash true``, and where the children
ran. Run it alone on the machine (``flock /tmp/ray-tests.lock``): one Ray cluster at a time.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from typing import Any

from toolseam import Toolkit
from toolseam.backends.remote import HostedSpec, RemoteBackend
from toolseam.ray.placement import Placement
from toolseam.ray.transport import RayTransport

# node name -> (the engine it hosts, the variable naming that engine's endpoint)
NODES = {"ray-a": ("podman", "TOOLSEAM_PODMAN_URL"),
         "ray-b": ("podman-rootless", "TOOLSEAM_PODMAN_ROOTLESS_URL"),
         "ray-c": ("podman", "TOOLSEAM_PODMAN_URL")}
RESOURCE = "toolseam-branch-bench"
# FILES files of EACH random bytes in 20 directories, as branch.py's make_workspace
_FILL = """python3 -c 'import os
for n in range(FILES):
    d = "d%02d" % (n % 20)
    os.makedirs(d, exist_ok=True)
    open("%s/f%05d" % (d, n), "wb").write(os.urandom(EACH))'"""


def _node_args(name: str) -> dict[str, Any]:
    engine, variable = NODES[name]
    options = {"image": os.environ["TOOLSEAM_IMAGE"], "endpoint": os.environ[variable]}
    env = {"TOOLSEAM_RAY_BACKEND": engine, "TOOLSEAM_RAY_NODE_NAME": name,
           "TOOLSEAM_RAY_BACKEND_OPTIONS": json.dumps(options)}
    return dict(node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=1,
                resources={RESOURCE: 1000}, env_vars=env)


async def measure_ray(files: int, mib: int, children: int) -> dict[str, str]:
    from ray.cluster_utils import Cluster  # the optional extra: only this row needs it

    row: dict[str, str] = {}
    began = time.perf_counter()
    names = list(NODES)
    cluster = Cluster(initialize_head=True, shutdown_at_exit=True,
                      head_node_args=_node_args(names[0]))
    try:
        for name in names[1:]:
            cluster.add_node(**_node_args(name))
        cluster.wait_for_nodes()
        row["cluster up (3 nodes)"] = f"{time.perf_counter() - began:.1f} s"
        backend = RemoteBackend(transport=RayTransport(Placement({RESOURCE: 1}),
                                                       cluster.gcs_address),
                                hosted=HostedSpec(kind="podman"))
        async with Toolkit(backend) as tk:
            each = (mib << 20) // files
            await tk.call("bash", {"command": _FILL.replace("FILES", str(files)).replace(
                "EACH", str(each)), "timeout": 300_000})
            clock = time.perf_counter()
            await tk.snapshot()
            row["first snapshot"] = f"{(time.perf_counter() - clock) * 1000:.0f} ms"
            clock = time.perf_counter()
            kids = [k for k in await tk.fork(children) if isinstance(k, Toolkit)]
            await _first_answers(kids)
            row[f"fork({children}) to every first answer"] = (
                f"{time.perf_counter() - clock:.2f} s ({len(kids)} of {children} children)")
            where = Counter(k.backend.transport.node_id for k in kids)
            parent = tk.backend.transport.node_id
            row["children per node"] = " / ".join(
                str(count) for _, count in sorted(where.items())) + (
                f" on {len(where)} nodes (parent's node: {where.get(parent, 0)})")
            for kid in kids:
                await kid.close()
    finally:
        import ray
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
    return row


async def _first_answers(kids: list[Toolkit]) -> None:
    await asyncio.gather(*(k.call("bash", {"command": "true"}) for k in kids))
