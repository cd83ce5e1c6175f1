"""The direct path of a Ray-shaped sandbox's ``exec``, ``read_file`` and ``write_file``: the
node actor's direct port (``ray/direct.py``, the route ``RayBackend``'s calls take once open),
whose handshake proves the session's key both ways before anything is decoded, instead of a
Ray call (1-2 ms here by itself, over the budget of "local + 1 ms").

Ray's shape still holds: ``.remote(...)`` returns an ObjectRef. A ``ray.put`` per call costs
more than a Ray call does (it goes to the object store), so refs are made ``AHEAD`` at a time
by one call of the node actor with as many returns (``remote_refs``), each the call's token
read by ``_outcome_of``: in the process that made the call, the answer it received, and in any
other process the answer the node kept under the token (``remote_collect``, waited for; kept
60 s after the call ended). Only a call that ended within ``GRACE_S`` gets such a ref; one
still running then (or whose connection dropped) gets the ref of the node actor's
``remote_collect`` of its token, ready once the call ended and read in Ray's shape where it is
read (``ReadAs``, decision 511) — so ``ray.wait`` means what it means for an actor's refs.
``.remote()`` never waits longer than the grace, long commands run side by side, and a failure
surfaces at ``ray.get`` as Ray's own kind (read as the ``RayTaskError`` of it, which
``ray.get`` raises as that kind).

Where the holder cannot reach the port, or inside a running event loop (an async actor, which
waiting would block), calls go through Ray (``_ray_sandbox_calls.through_ray``). Each thread
of each process holding a sandbox makes its own connection, driven by its own event loop (no
thread hop on a call's path); a connection is never pickled, and one whose sandbox nobody
holds is closed.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
import uuid
import weakref
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from ..backends.remote.codec import loads
from ..backends.remote.handshake import derived_key
from ..backends.remote.server import SESSION_LABEL
from ..ray import cluster
from ..ray.direct import CONNECT_TIMEOUT_S, DirectLink
from ..ray.node_remote import REMOTE
from . import _ray_sandbox_calls as calls

GRACE_S = 0.03  # a call still running after this gets the ref of the node's collect
CALLS = frozenset({"exec", "read_file", "write_file"})
OFF_VARIABLE = "TOOLSEAM_RAY_SHAPED_DIRECT"  # "0": every call through Ray (for comparison)
AHEAD, LOW = 32, 8  # refs made at once; when fewer are left, the next batch is asked for
ANSWERS_KEPT = 1024  # answers this process keeps for its refs (then the node's copy is read)


@dataclass
class _Link:
    link: DirectLink | None  # None: this sandbox has no direct path from this thread
    owner: weakref.ref[Any]  # the sandbox last called through it: gone, the link closes
    ahead: deque[tuple[Any, str]] = field(default_factory=deque)  # (ref, token) made ahead


class _ThreadState(threading.local):
    loop: asyncio.AbstractEventLoop | None = None
    pid = 0
    links: dict[str, _Link]


_state = _ThreadState()
_unreachable: set[str] = set()  # nodes this process could not connect to in time
_lock = threading.Lock()
_answers: OrderedDict[str, Any] = OrderedDict()  # token -> the value this process received


@dataclass(frozen=True)
class _Reader:
    """Reads a token made ahead as its call's value (``_outcome_of``): it holds the sandbox's
    secret, as the sandbox does, and never shows it."""

    node_id: str
    sandbox_id: str
    secret: str = field(repr=False)

    def __call__(self, token: str) -> Any:
        return _outcome_of(self.node_id, self.sandbox_id, self.secret, token)


def _outcome_of(node_id: str, sandbox_id: str, secret: str, token: str) -> Any:
    """What a ref made ahead reads as (its unpickling, in the process reading it): the value
    this process received, else the node's kept answer (waited for); a failure as a
    ``RayTaskError`` of it, which ``ray.get`` raises as the failure's own kind."""
    with _lock:
        if token in _answers:
            return _answers[token]
    ray = cluster.ray_module()
    answer = loads(ray.get(cluster.found_actor(ray, node_id).remote_collect.remote(
        sandbox_id, secret, token)))
    return calls.shaped(answer, sandbox_id, node_id)


def call(sandbox: Any, name: str, args: tuple[Any, ...]) -> Any:
    """The call's ObjectRef by the direct path, or None: take the Ray path."""
    if name not in CALLS or os.environ.get(OFF_VARIABLE) == "0":
        return None
    if asyncio._get_running_loop() is not None:
        return None  # inside a running loop: this thread cannot wait for an answer
    loop = _thread_loop()
    held = _link_of(loop, sandbox)
    if held is None or held.link is None or not held.link.alive:
        return None
    req = calls.request(sandbox, sandbox._info, name, args)
    if len(held.ahead) <= LOW:
        _ask_ahead(sandbox, held)
    ref, token = held.ahead.popleft()
    began = time.perf_counter()
    sent = loop.create_task(held.link.call(REMOTE, (req, sandbox._owner, token)))
    loop.run_until_complete(asyncio.wait({sent}, timeout=GRACE_S))
    if not sent.done() or sent.exception() is not None:
        sent.add_done_callback(_retrieved)  # running (or dropped): the node keeps its answer
        # a ref ready only once the call ended (the batch ref would be ready at once): the
        # node's collect of its answer, read in Ray's shape where the ref is read
        return sandbox._actor.remote_collect.remote(
            sandbox.sandbox_id, sandbox._secret, token,
            reader=functools.partial(calls.read_answer, sandbox.sandbox_id, sandbox.node_id))
    answer = sent.result()
    result = calls.shaped(answer[1] if answer[:1] == ("ok",) else answer, sandbox.sandbox_id,
                   sandbox.node_id, time.perf_counter() - began)
    with _lock:
        _answers[token] = result
        while len(_answers) > ANSWERS_KEPT:
            _answers.popitem(last=False)
    return ref


def _retrieved(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()  # read, so nothing reports it as never retrieved


def _ask_ahead(sandbox: Any, held: _Link) -> None:
    """``AHEAD`` more refs from one call of the node actor (``remote_refs``: answered while
    they are used — a ref whose batch has not come yet is read when it comes)."""
    tokens = tuple(uuid.uuid4().hex for _ in range(AHEAD))
    reader = _Reader(sandbox.node_id, sandbox.sandbox_id, sandbox._secret)
    refs = sandbox._actor.remote_refs.options(num_returns=AHEAD).remote(reader, tokens)
    held.ahead.extend(zip(refs, tokens, strict=True))


def _thread_loop() -> asyncio.AbstractEventLoop:
    """This thread's loop for its links (a forked child starts afresh)."""
    if _state.loop is None or _state.pid != os.getpid():
        _state.loop, _state.pid, _state.links = asyncio.new_event_loop(), os.getpid(), {}
    return _state.loop


def _link_of(loop: asyncio.AbstractEventLoop, sandbox: Any) -> _Link | None:
    """This thread's link to the sandbox, made once its creation is over; None while it runs
    or if it failed (those calls take the Ray path, which waits or raises)."""
    held = _state.links.get(sandbox.sandbox_id)
    if held is not None:
        if held.owner() is not sandbox:  # another copy (each task unpickles its own)
            held.owner = weakref.ref(sandbox)
        return held
    _close_dropped()
    if calls.made_info(sandbox) is None:
        return None
    ray = cluster.ray_module()
    try:
        direct = ray.get(sandbox._ready).get("direct")
    except Exception:  # noqa: BLE001 - the Ray path says what failed
        return None
    link = None
    if direct and sandbox.node_id not in _unreachable:
        began = time.monotonic()
        link = loop.run_until_complete(DirectLink.connect(
            str(direct[0]), int(direct[1]), sandbox.sandbox_id,
            derived_key(sandbox._secret, SESSION_LABEL)))
        if link is None and time.monotonic() - began >= CONNECT_TIMEOUT_S / 2:
            _unreachable.add(sandbox.node_id)  # silent, not refused: later sandboxes skip it
    held = _state.links[sandbox.sandbox_id] = _Link(link, weakref.ref(sandbox))
    return held


def _close_dropped() -> None:
    """Close this thread's links to sandboxes nobody holds any more (dropped without
    ``delete``: their node ends them after the orphan timeout)."""
    for sandbox_id, held in list(_state.links.items()):
        if held.owner() is None:
            del _state.links[sandbox_id]
            if held.link is not None:
                held.link.close()


def forget(sandbox_id: str) -> None:
    """The sandbox was deleted: close this thread's link to it."""
    if _state.loop is None or _state.pid != os.getpid():
        return
    held = _state.links.pop(sandbox_id, None)
    if held is not None and held.link is not None and not _state.loop.is_running():
        held.link.close()
        _state.loop.run_until_complete(asyncio.sleep(0))
