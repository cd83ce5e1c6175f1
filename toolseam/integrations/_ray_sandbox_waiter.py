"""The ref a Ray-shaped call gets when it is still running after the direct path's grace, or
its connection dropped (``_ray_sandbox_direct.py``): a method call of this process's ``Waiter``
actor, which waits for the answer the node kept under the call's token (``remote_collect``,
checked against the sandbox's secret there) and returns it read in Ray's shape, or raises the
failure's own kind — so ``ray.wait`` reports the ref ready once the call ended, as it does an
actor method's ref. The node stays generic: it returns the encoded answer and never runs
caller code; the reading happens here, in a process of the caller's own job.

One actor per process, made at the first running call (a process whose calls all end within
the grace starts none), asynchronous (a waiting coroutine per running call, not a thread or a
worker: a Ray task per call cost a worker start each, 2.6 s for three 1-s commands),
``num_cpus=0``, and not detached, so Ray ends it with the process that owns it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

from ..backends.remote.codec import loads
from ..ray import cluster
from . import _ray_sandbox_calls as calls

MAX_WAITING = 1000  # running calls one process's waiter waits for at once (then they queue)
RESTARTS = 3  # a waiter that died is started again and its waits asked again: reading a kept
# answer twice is harmless (the node keeps it 60 s after the call ended)

_lock = threading.Lock()
_held: dict[int, Any] = {}  # pid -> this process's waiter (a forked child makes its own)


class Waiter:
    """Waits on the nodes for running calls' answers (a Ray actor, see ``collect``)."""

    async def collect(self, node_id: str, sandbox_id: str, secret: str, token: str) -> Any:
        """The call's value in Ray's shape once it ended, or its failure raised."""
        ray = cluster.ray_module()
        # finding a node actor may wait on Ray (once a node): not on this actor's loop
        node = await asyncio.to_thread(cluster.found_actor, ray, node_id)
        answer = loads(await node.remote_collect.remote(sandbox_id, secret, token))
        return calls.value(answer, sandbox_id, node_id)

    async def call(self, sandbox: Any, name: str, args: tuple[Any, ...]) -> Any:
        """A call through Ray (its holder cannot take the direct path, or the creation still
        runs): the creation awaited, the request sent as the node actor's call, the answer
        read in Ray's shape — two actor calls: 7-8.5 ms, about what a Ray task per call cost
        (8-10 ms), but no worker process per call running at once (decision 506)."""
        for ref in (sandbox._opened, sandbox._made):
            if ref is not None:
                await ref
        info = await asyncio.to_thread(calls.opened_info, sandbox)  # its refs are ready now
        began = time.perf_counter()
        answer = loads(await sandbox._actor.remote_call.remote(
            calls.payload(calls.request(sandbox, info, name, args)), sandbox._owner,
            sandbox._orphan_timeout))
        return calls.value(answer, sandbox.sandbox_id, sandbox.node_id,
                           time.perf_counter() - began)


def collect(node_id: str, sandbox_id: str, secret: str, token: str) -> Any:
    """The ref of the running call ``token``: ready when it ended, read as its value."""
    return _waiter().collect.remote(node_id, sandbox_id, secret, token)


def call(sandbox: Any, name: str, args: tuple[Any, ...]) -> Any:
    """The ref of a call through Ray: never asked again of a restarted waiter (a command is
    not run twice)."""
    return _waiter().call.options(max_task_retries=0).remote(sandbox, name, args)


def _waiter() -> Any:
    """This process's waiter, started at its first use."""
    with _lock:
        waiter = _held.get(os.getpid())
        if waiter is None:
            ray = cluster.ray_module()
            waiter = _held[os.getpid()] = ray.remote(
                num_cpus=0, max_concurrency=MAX_WAITING, max_restarts=RESTARTS,
                max_task_retries=RESTARTS)(Waiter).remote()
    return waiter
