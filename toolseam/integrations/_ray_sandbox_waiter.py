"""The ref a Ray-shaped call gets while its sandbox's creation still runs here (the first call
of a rollout that uses its sandbox at once), or once the creation failed: a method call of this
process's ``Waiter`` actor, which awaits the creation, sends the request as the node actor's
``remote_call`` and returns the answer read in Ray's shape, or raises the creation's or the
call's failure as its own kind — so ``.remote()`` never waits for a creation, and ``ray.wait``
reports the ref ready once the call ended, as it does an actor method's ref. Once this process
knows the creation is over, a call is the node actor's own (``_ray_sandbox_calls.through_ray``)
or takes the direct path (``_ray_sandbox_direct.py``), and no waiter is started.

One actor per process, made at its first such call, asynchronous (a waiting coroutine per call,
not a thread or a worker), ``num_cpus=0``, and not detached, so Ray ends it with the process
that owns it. Its calls are never asked again of a restarted waiter: a command is not run twice.
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

MAX_WAITING = 1000  # calls one process's waiter waits for at once (then they queue)
RESTARTS = 3  # a waiter that died is started again for later calls (never to repeat one)

_lock = threading.Lock()
_held: dict[int, Any] = {}  # pid -> this process's waiter (a forked child makes its own)


class Waiter:
    """Waits for sandboxes' creations, then sends their calls (a Ray actor, see ``call``)."""

    async def call(self, sandbox: Any, name: str, args: tuple[Any, ...]) -> Any:
        """The creation awaited, the request sent as the node actor's call, the answer read
        in Ray's shape (decisions 506, 511)."""
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


def call(sandbox: Any, name: str, args: tuple[Any, ...]) -> Any:
    """The ref of a call made while the creation runs (or after it failed)."""
    return _waiter().call.remote(sandbox, name, args)


def _waiter() -> Any:
    """This process's waiter, started at its first use."""
    with _lock:
        waiter = _held.get(os.getpid())
        if waiter is None:
            ray = cluster.ray_module()
            waiter = _held[os.getpid()] = ray.remote(
                num_cpus=0, max_concurrency=MAX_WAITING, max_restarts=RESTARTS,
                max_task_retries=0)(Waiter).remote()
    return waiter
