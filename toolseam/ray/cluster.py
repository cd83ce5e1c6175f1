"""Reaching the cluster, choosing a node, and the node actors.

Node actors are *detached* (decisions 195): a session must outlive the driver that opened it
(a new driver attaches and continues its jobs), so its host may not die with that driver; the
orphan timeout, not the driver's lifetime, ends what nobody holds any more.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

from .._extras import install_hint
from ..seam.errors import BackendUnavailable, ConfigurationError, CouldNotRunError
from . import identity

NAMESPACE = "toolseam"
ACTOR_PREFIX = "toolseam-node-"
CONNECT_TIMEOUT_S = 5.0

log = logging.getLogger("toolseam.ray")
UNAUTHENTICATED = (
    "the Ray cluster at {address} is used without token authentication (RAY_AUTH_MODE=token "
    "is not set here): any process that reaches its GCS — on a shared machine every local "
    "user, even on 127.0.0.1 — can run code on its nodes, end its node actors and read the "
    "sessions there (docs/ray.md, 'Who may reach it')")
_lock = threading.Lock()
_actors: dict[str, Any] = {}


def ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise BackendUnavailable(f"toolseam.ray needs Ray: {install_hint('ray')}") from None
    return ray


def connect(address: str | None) -> Any:
    """This process's connection to the cluster at ``address`` (None: the one already made,
    else ``RAY_ADDRESS``/the local cluster, as ``ray.init`` finds it). An address that does not
    answer is a ``ConfigurationError`` naming it within ``CONNECT_TIMEOUT_S`` — ``ray.init``
    itself would retry for a long while."""
    ray = ray_module()
    if ray.is_initialized():
        _same_cluster(ray, address)
        return ray
    if address and address != "auto" and not address.startswith("ray://"):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host or "127.0.0.1", int(port)), CONNECT_TIMEOUT_S):
                pass
        except (OSError, ValueError) as exc:
            raise ConfigurationError(f"the Ray cluster at {address} does not answer ({exc})"
                                     ) from None
    loopback = _is_loopback(address)
    try:
        with _loopback_kept(ray, loopback):
            # no _node_ip_address: Ray finds this machine's raylet of that cluster itself,
            # whatever address it registered (a head started without Ray's loopback switch
            # registers the machine's outward one, and a driver that asked for 127.0.0.1
            # waited a minute for a node that never matched)
            ray.init(address=address or "auto", log_to_driver=False, logging_level="error",
                     configure_logging=False)
    except ConnectionError as exc:
        raise ConfigurationError(refused_message(address or "auto", exc)) from None
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        log.warning(UNAUTHENTICATED.format(address=address or "auto"))
    return ray


def refused_message(address: str, exc: BaseException) -> str:
    """What a driver Ray would not connect is told: most often a cluster with token
    authentication (Ray 2.60's first local ``ray.init`` turns it on and writes
    ``~/.ray/auth_token``) and a driver that does not send the token."""
    if address == "auto":
        return (f"no Ray cluster to connect to ({exc}): pass address='HOST:PORT' (the head's "
                "--port), set RAY_ADDRESS, or start one (docs/ray.md, 'Starting a cluster')")
    mode = os.environ.get("RAY_AUTH_MODE")
    told = f"RAY_AUTH_MODE is {mode!r} here" if mode else "RAY_AUTH_MODE is not set here"
    return (f"the Ray cluster at {address} refused this driver or never answered it ({exc}). "
            f"A cluster with token authentication needs RAY_AUTH_MODE=token in this process "
            f"and its token: ~/.ray/auth_token of this user, RAY_AUTH_TOKEN or "
            f"RAY_AUTH_TOKEN_PATH ({told}; docs/ray.md, 'Starting a cluster')")


def _same_cluster(ray: Any, address: str | None) -> None:
    """One process, one cluster (Ray's own rule): another address is refused, naming both."""
    if not address or address == "auto" or address.startswith("ray://"):
        return
    connected = str(ray.get_runtime_context().gcs_address)
    if connected.rpartition(":")[2] != address.rpartition(":")[2]:
        raise ConfigurationError(f"this process is connected to the Ray cluster at {connected}; "
                                 f"a process reaches one cluster (asked: {address})")


@contextlib.contextmanager
def _loopback_kept(ray: Any, loopback: bool) -> Iterator[None]:
    """While ``ray.init`` runs, a loopback address stays loopback. Ray 2.60 rewrites
    ``127.0.0.1`` (the cluster's address and the driver's own) to the machine's outward
    address, where a cluster started with ``node_ip_address="127.0.0.1"`` does not listen: the
    driver then waits for a GCS that never answers (decision 270)."""
    services = ray._private.services
    original = services.resolve_ip_for_localhost
    if loopback:
        services.resolve_ip_for_localhost = lambda host: host
    try:
        yield
    finally:
        services.resolve_ip_for_localhost = original


def _is_loopback(address: str | None) -> bool:
    """A cluster on this machine's loopback (``127.0.0.1:P``, ``localhost:P``)."""
    if os.environ.get("RAY_NODE_IP_ADDRESS") or not address:
        return False
    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


_lost: set[str] = set()  # nodes this process saw die: Ray reports them alive for a while


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node.get("Alive") and node["NodeID"] not in _lost]


def describe_resources(resources: dict[str, float]) -> str:
    return ", ".join(f"{name}={value:g}" for name, value in sorted(resources.items())) or "none"


def fitting_nodes(ray: Any, resources: dict[str, float]) -> list[dict[str, Any]]:
    """Alive nodes whose total resources include ``resources``; none is a refusal naming the
    resources asked (Ray would queue such an actor forever)."""
    nodes = alive_nodes(ray)
    fit = [node for node in nodes
           if all(node["Resources"].get(name, 0) >= value for name, value in resources.items())]
    if not fit:
        offered = "; ".join(describe_resources(node["Resources"]) for node in nodes)
        raise CouldNotRunError(f"no node of the Ray cluster offers the resources asked "
                               f"({describe_resources(resources)}); the nodes offer: "
                               f"{offered or 'no node is alive'}", retryable=False)
    return fit


def node_is_alive(ray: Any, node_id: str) -> bool:
    return any(node["NodeID"] == node_id for node in alive_nodes(ray))


def cluster_key() -> bytes:
    """This process's cluster key (identity.py), read once."""
    global _cluster_key
    if _cluster_key is None:
        _cluster_key = identity.cluster_key()
    return _cluster_key


_cluster_key: bytes | None = None


def actor_name(node_id: str) -> str:
    """The name of the node's actor for this process's cluster key."""
    return identity.actor_name(ACTOR_PREFIX, identity.node_key(cluster_key(), node_id), node_id)


def known_actor(node_id: str) -> Any:
    """The node's actor this process holds already, or None."""
    with _lock:
        return _actors.get(node_id)


def keep_actor(node_id: str, actor: Any) -> Any:
    """Hold ``actor`` as the node's (the first one kept wins: two threads may make it)."""
    with _lock:
        return _actors.setdefault(node_id, actor)


def found_actor(ray: Any, node_id: str) -> Any:
    """The node's actor made already (by this process or another driver): held, or found by
    its name and used only once it proved the node key (identity.py). Making one is
    ``actors.node_actor``'s."""
    actor = known_actor(node_id)
    if actor is not None:
        return actor
    key = identity.node_key(cluster_key(), node_id)
    name = identity.actor_name(ACTOR_PREFIX, key, node_id)
    try:
        actor = ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        raise CouldNotRunError(f"Ray node {node_id[:12]} has no toolseam node actor (any "
                               "more)", retryable=False) from None
    identity.wait_proven(ray, actor, key, name)
    return keep_actor(node_id, actor)


def forget_actor(node_id: str, lost: bool = False) -> None:
    """Drop the node's actor handle; ``lost``: its node died under a call — place nothing
    there again from this process (Ray's health check reports it alive for several more
    seconds, and a session placed there would be lost at once)."""
    with _lock:
        _actors.pop(node_id, None)
        _where.pop(node_id, None)
        _direct.pop(node_id, None)
        if lost:
            _lost.add(node_id)


_where: dict[str, str] = {}
_direct: dict[str, tuple[str, int] | None] = {}


async def node_where(node_id: str, ready: Any) -> str:
    """The node's description from its actor's first ``ready`` answer (which also starts its
    reaper), once per node and process; ``ready`` is awaited only the first time."""
    known = _where.get(node_id)
    if known is not None:
        ready.close()  # the coroutine not needed
        return known
    answer = await ready
    direct = answer.get("direct")
    _direct[node_id] = (str(direct[0]), int(direct[1])) if direct else None
    _where[node_id] = str(answer["where"])
    return _where[node_id]


def node_direct(node_id: str) -> tuple[str, int] | None:
    """Where the node actor takes direct tool calls (direct.py), from its ``ready`` answer."""
    return _direct.get(node_id)


def no_direct(node_id: str) -> None:
    """This process could not reach the node's direct port: its sessions use Ray calls."""
    _direct[node_id] = None


def ray_failures(ray: Any) -> tuple[type[BaseException], ...]:
    """What Ray raises when the actor, its worker or its node is gone."""
    exc = ray.exceptions
    return tuple(getattr(exc, name) for name in (
        "RayActorError", "ActorDiedError", "ActorUnavailableError", "NodeDiedError",
        "WorkerCrashedError", "ObjectLostError", "OwnerDiedError", "RaySystemError",
        "GetTimeoutError") if hasattr(exc, name))
