"""The direct path for ``toolseam.ray.create``'s sandboxes (decision 340): ``exec``,
``read_file`` and ``write_file`` go on a connection of this process to the node actor
(direct.py, the path ``RayBackend``'s tool calls take, decision 312) instead of a Ray actor
call, whose own cost (1-2 ms here) is more than the whole budget of "local + 1 ms".

Ray's shape still holds: ``.remote(...)`` returns an ObjectRef that ``ray.get`` reads. A call
that answers within ``GRACE_S`` comes back as an ObjectRef made *before* the call: one
``ray.put`` costs about what a Ray actor call does here (0.5-1 ms), so the refs are made
``AHEAD`` at a time by ONE call of the node actor with as many returns (``sb_outcomes``),
asked for while enough are left. What such a ref holds is the call's token, and reading it (Ray
unpickles it in the reading process) gives the answer this process received — or, in another
process the ref was passed to, the node's kept outcome (``sb_collect``). A call still running
after the grace — or one that failed, or whose connection dropped — is handed to Ray: the
returned ref is the node actor's ``sb_collect`` of the same call, which waits for it on the
node and answers (or raises) exactly as the Ray path would. So ``[sb.exec.remote(c) for c in cmds]``
still runs long commands side by side, and an error still surfaces at ``ray.get``, as Ray's
own ``SandboxError`` kinds, never at ``.remote``.

Where the holder cannot reach the node's direct port (a Ray task on another machine behind a
firewall, a node without one), the creation is still running, or the caller is inside a
running event loop (an async actor: waiting there would block it), calls go through Ray as
before. Each thread of each process holding a ``RaySandbox`` (the driver, each task it is
passed to) makes its own connection, driven by its own event loop in that thread — no
thread hop on a call's path (each costs a scheduler wake-up, which on a loaded machine is
most of the budget); the link is never pickled.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .direct import CONNECT_TIMEOUT_S, DirectLink
from .handshake import session_key
from .shaped_outcome import answered
from .shaped_types import ExecResult

GRACE_S = 0.03  # a call still running after this is handed to Ray (see the module docstring)
DIRECT_CALLS = frozenset({"exec", "read_file", "write_file"})
OFF_VARIABLE = "TOOLSEAM_RAY_SHAPED_DIRECT"  # "0": every call through Ray (for comparison)
AHEAD, LOW = 32, 8  # refs made at once; when fewer are left, the next batch is asked for


@dataclass
class _Link:
    link: DirectLink | None  # None: this sandbox has no direct path from this thread
    owner: weakref.ref[Any]  # the RaySandbox last called through it: gone, the link closes
    ahead: deque[tuple[Any, str]] = field(default_factory=deque)  # (ref, token) put ahead


class _ThreadState(threading.local):
    loop: asyncio.AbstractEventLoop | None = None
    pid = 0
    links: dict[str, _Link]


_unreachable: set[str] = set()  # nodes this process could not connect to in time
_state = _ThreadState()


def _thread_loop() -> asyncio.AbstractEventLoop:
    """This thread's loop for its links (a forked child starts afresh)."""
    if _state.loop is None or _state.pid != os.getpid():
        _state.loop, _state.pid, _state.links = asyncio.new_event_loop(), os.getpid(), {}
    return _state.loop


def call(sandbox: Any, name: str, args: tuple[Any, ...]) -> Any:
    """The call's ObjectRef by the direct path, or None: take the Ray path."""
    if name not in DIRECT_CALLS or os.environ.get(OFF_VARIABLE) == "0":
        return None
    if asyncio._get_running_loop() is not None:
        return None  # inside a running loop: this thread cannot wait for an answer
    loop = _thread_loop()
    held = _link_of(loop, sandbox)
    if held is None or held.link is None or not held.link.alive:
        return None
    if len(held.ahead) <= LOW:
        _ask_ahead(sandbox, held)
    ref, token = held.ahead.popleft()
    request = loop.create_task(held.link.call(f"sb_{name}", (token, *args)))
    loop.run_until_complete(asyncio.wait({request}, timeout=GRACE_S))
    if not request.done() or request.exception() is not None:
        request.add_done_callback(_retrieved)
        # still running, or the connection dropped (the node kept the call's outcome if it
        # is there): Ray waits for it
        return sandbox._actor.sb_collect.remote(sandbox.sandbox_id, sandbox._secret, token)
    answer = request.result()
    if answer[0] != "ok":  # failed: the node raises it again through Ray, as Ray's own
        return sandbox._actor.sb_collect.remote(sandbox.sandbox_id, sandbox._secret, token)
    value = ExecResult(*answer[1]) if name == "exec" else answer[1]
    answered(token, value)
    return ref


def _retrieved(done: asyncio.Future[Any]) -> None:
    if not done.cancelled():
        done.exception()  # read, so nothing reports it as never retrieved


def _ask_ahead(sandbox: Any, held: _Link) -> None:
    """``AHEAD`` more refs, from one call of the node actor (answered while they are used:
    a ref whose batch has not come yet is read when it comes)."""
    tokens = [uuid.uuid4().hex for _ in range(AHEAD)]
    refs = sandbox._actor.sb_outcomes.options(num_returns=AHEAD).remote(
        sandbox.sandbox_id, sandbox._secret, tokens)
    held.ahead.extend(zip(refs, tokens, strict=True))


def _link_of(loop: asyncio.AbstractEventLoop, sandbox: Any) -> _Link | None:
    """This thread's link to the sandbox, made once its creation is over; None while it
    runs (those calls take the Ray path, which waits for it)."""
    held = _state.links.get(sandbox.sandbox_id)
    if held is not None:
        if held.owner() is not sandbox:  # another copy (each task unpickles its own)
            held.owner = weakref.ref(sandbox)
        return held
    _close_dropped()
    ray = sandbox._ray()
    if sandbox._opened is not None:
        ready, _ = ray.wait([sandbox._opened], timeout=0)
        if not ready:
            return None
    link = None
    at = _direct_address(ray, sandbox)
    if at is not None and sandbox.node_id not in _unreachable:
        began = time.monotonic()
        link = loop.run_until_complete(
            DirectLink.connect(at[0], at[1], sandbox.sandbox_id, session_key(sandbox._secret)))
        if link is None and time.monotonic() - began >= CONNECT_TIMEOUT_S / 2:
            _unreachable.add(sandbox.node_id)  # silent, not refused: later sandboxes skip it
    held = _state.links[sandbox.sandbox_id] = _Link(link, weakref.ref(sandbox))
    return held


def _close_dropped() -> None:
    """Close this thread's links to sandboxes nobody holds any more (dropped without
    ``delete``: their node ends them after the orphan timeout), so a loop that makes many
    sandboxes does not keep a connection per sandbox."""
    for sandbox_id, held in list(_state.links.items()):
        if held.owner() is None:
            del _state.links[sandbox_id]
            if held.link is not None:
                held.link.close()


def _direct_address(ray: Any, sandbox: Any) -> tuple[str, int] | None:
    """Where the node actor takes direct calls, from its ``ready`` answer (the one
    ``create`` asked for, carried with the sandbox to every process it is passed to)."""
    if sandbox._ready is None:
        return None
    try:
        answer = ray.get(sandbox._ready)
    except Exception:  # noqa: BLE001 - the node is gone or failed: the Ray path says which
        return None
    direct = answer.get("direct")
    return (str(direct[0]), int(direct[1])) if direct else None


def forget(sandbox_id: str) -> None:
    """The sandbox was deleted: close this thread's link to it."""
    if _state.loop is None or _state.pid != os.getpid():
        return
    held = _state.links.pop(sandbox_id, None)
    if held is not None and held.link is not None and not _state.loop.is_running():
        held.link.close()
        _state.loop.run_until_complete(asyncio.sleep(0))
