"""The node actor made: one per Ray node (``node.py``'s ``NodeSessions`` as a Ray actor class),
named, detached, pinned to its node, no CPU. Apart from ``cluster.py`` so that what only
finds an actor made already (a ref of a Ray-shaped sandbox read in another process,
``shaped_outcome.py``) does not import the node side.
"""

from __future__ import annotations

import threading
from typing import Any

from . import cluster, identity
from .node import NodeSessions

_making = threading.Lock()
_actor_class: Any = None


def node_actor(ray: Any, node_id: str) -> Any:
    """The node's actor: named (a name only holders of the cluster key can know), detached,
    pinned to its node, no CPU. Made here, it is given the node key by its first call; found
    made by another driver, it is used only once it proved that key on its direct port
    (identity.py) — an impostor under the name is never sent anything. May block a few
    seconds (an actor another driver is still starting): call it off the event loop."""
    global _actor_class
    with _making:
        actor = cluster.known_actor(node_id)
        if actor is not None:
            return actor
        if _actor_class is None:
            _actor_class = ray.remote(NodeSessions)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        key = identity.node_key(cluster.cluster_key(), node_id)
        name = identity.actor_name(cluster.ACTOR_PREFIX, key, node_id)
        try:
            actor = _actor_class.options(
                name=name, namespace=cluster.NAMESPACE, lifetime="detached",
                get_if_exists=False, num_cpus=0, max_concurrency=10_000, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
            ).remote()
            actor.bind_key.remote(key)  # its first call from here: before any other
        except ValueError:  # the name is taken (ActorAlreadyExistsError): prove it first
            actor = ray.get_actor(name, namespace=cluster.NAMESPACE)
            identity.wait_proven(ray, actor, key, name)
        return cluster.keep_actor(node_id, actor)
