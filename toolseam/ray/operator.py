"""``toolseam ps --ray ADDRESS``: the sessions of a Ray cluster's toolseam node actors, listed
and ended from any machine that holds the cluster key (issue 49; ``node_operator.py`` is the
node's side). A node actor is asked only once it proved the node key on its direct port
(``identity.wait_proven``), so a job posing under its name is shown nothing and lists nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..backends.agentlink.errors import map_seam_error
from . import cluster, identity


def _node_actors(ray: Any) -> Iterator[tuple[str, Any, bytes]]:
    """(node id, its proven actor, its node key) for each live node that has a toolseam actor
    of this cluster key."""
    key = cluster.cluster_key()
    for node in cluster.alive_nodes(ray):
        node_id = str(node["NodeID"])
        name = cluster.actor_name(node_id)
        try:
            actor = ray.get_actor(name, namespace=cluster.NAMESPACE)
        except ValueError:  # no toolseam session was ever opened there with this key
            continue
        node_key = identity.node_key(key, node_id)
        identity.wait_proven(ray, actor, node_key, name)
        yield node_id, actor, node_key


def _asked(ray: Any, actor: Any, node_key: bytes, what: str, method: str, *args: Any) -> Any:
    nonce = ray.get(actor.operator_nonce.remote())
    proof = identity.operator_proof(node_key, nonce, what)
    answer = ray.get(getattr(actor, method).remote(*args, nonce, proof))
    if answer[0] != "ok":
        raise map_seam_error(answer[1])
    return answer[1]


def cluster_sessions(address: str) -> list[dict[str, Any]]:
    """Every session on the cluster at ``address`` that this cluster key's drivers opened, a
    ``toolseam ps`` row each (``node``: the Ray node id; ``owner_pid``: None, the driver may
    be on any machine)."""
    ray = cluster.connect(address)
    rows: list[dict[str, Any]] = []
    for _, actor, node_key in _node_actors(ray):
        rows += _asked(ray, actor, node_key, "list", "operator_sessions")
    return rows


def kill_on_cluster(address: str, session_id: str) -> bool:
    """End session ``session_id``'s sandbox on whichever node holds it; False when none does.
    Its driver's calls then fail as ``sandbox_lost``."""
    ray = cluster.connect(address)
    return any(_asked(ray, actor, node_key, f"kill {session_id}", "operator_kill", session_id)
               for _, actor, node_key in _node_actors(ray))
