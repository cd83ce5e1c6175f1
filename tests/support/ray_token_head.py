"""A one-node Ray cluster with token authentication, run as a program by
tests/backends/test_ray_auth.py: ``python ray_token_head.py TOKEN`` prints the address, serves
until its stdin closes, then stops. A host-engine node (cheap: the test is about who may reach
the cluster, not the engine)."""

from __future__ import annotations

import os
import sys

os.environ["RAY_AUTH_MODE"] = "token"  # before Ray is imported: it reads them then
os.environ["RAY_AUTH_TOKEN"] = sys.argv[1]

from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, shutdown_at_exit=True, head_node_args=dict(
    node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=1,
    env_vars={"TOOLSEAM_RAY_BACKEND": "host", "TOOLSEAM_RAY_NODE_NAME": "tokened"}))
print(cluster.gcs_address, flush=True)
sys.stdin.read()
cluster.shutdown()  # type: ignore[no-untyped-call]
