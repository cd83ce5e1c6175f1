"""``python -m toolseam.ray.start ARGS``: Ray's own ``ray start ARGS``, except that a loopback
``--node-ip-address`` or ``--address`` stays loopback (docs/ray.md, "Starting a cluster").

Ray 2.60 rewrites ``127.0.0.1`` to the machine's outward address when a node starts: the node
then registers and listens there, on every interface. For the head, Ray's own switch
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps it, but the same switch makes ``ray start
--address …`` refuse to join (no multi-node cluster on that machine) — so a second node of a
loopback-only cluster is started through this module, which keeps the address as given, as
toolseam's own connect does for drivers (decision 270).
"""

from __future__ import annotations

import sys

from .cluster import ray_module


def main(argv: list[str] | None = None) -> None:
    ray_module()  # Ray missing: say which extra to install
    from ray._private import services
    from ray.scripts.scripts import main as ray_main

    services.resolve_ip_for_localhost = lambda host: host
    sys.argv = ["ray", "start", *(sys.argv[1:] if argv is None else argv)]
    ray_main()  # type: ignore[no-untyped-call]


if __name__ == "__main__":
    main()
