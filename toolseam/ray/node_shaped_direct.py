"""The node actor's side of the direct path for ``toolseam.ray.create``'s sandboxes
(decision 340; the caller's side is shaped_direct.py): ``exec``, ``read_file`` and
``write_file`` on the node's direct port (``shaped_call``), the refs a holder's calls come
back as (``sb_outcomes``), and a call's outcome through Ray (``sb_collect``).

Each direct call's outcome is kept under its token until it is collected through Ray (a call
still running after the caller's grace, one that failed, or a ref read in another process),
``KEPT_S`` after it ended or once ``KEPT_MAX`` newer ones (or ``KEPT_BYTES`` of output)
ended — so a handed-over call is never lost and never run twice.
"""

from __future__ import annotations

import asyncio
import hmac
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..seam.errors import HostError
from ._wire import Answer, encode
from .handshake import session_key
from .shaped_outcome import Outcome
from .shaped_types import ExecResult, SandboxExecError

# the direct port's shaped calls: method -> the sandbox method that runs it
SHAPED_DIRECT = {"sb_exec": "sb_exec", "sb_read_file": "sb_read_file",
                 "sb_write_file": "sb_write_file"}


@dataclass(frozen=True)
class ProvenKey:
    """A sandbox's key its holder proved on the direct port (direct.py's handshake): it stands
    in for the secret, which that path never carries (holding the key is what the proofs show)."""

    key: bytes


def key_of(secret: str | ProvenKey) -> bytes:
    """What a sandbox's check compares: the key of a secret sent through Ray, or one proved."""
    return secret.key if isinstance(secret, ProvenKey) else session_key(secret)


KEPT_S = 60.0  # a direct call's outcome waits this long after it ended for its collect
KEPT_MAX = 1024  # ... and at most this many wait (the oldest ended go first)
KEPT_BYTES = 64 << 20  # ... holding at most this much output (one node actor serves all)


class ShapedDirectCalls:
    """Mixed into ``ShapedSandboxes`` (node_shaped.py), whose ``sb_*`` methods run the calls;
    ``NodeSessions`` (node.py) provides the secret check and the node's id."""

    node_id: str
    where: str

    def _session(self, sid: str, secret: str | ProvenKey) -> Any:  # node.py: checked
        raise NotImplementedError

    def _direct_init(self) -> None:
        # direct calls by token: (the hash of the sandbox's secret, the call running or ended)
        self._kept: OrderedDict[str, tuple[bytes, asyncio.Task[Any]]] = OrderedDict()
        self._kept_sizes: dict[str, int] = {}  # token -> the size of its ended call's output

    async def shaped_call(self, sid: str, secret: str | ProvenKey, method: str,
                          args: tuple[Any, ...]) -> Answer:
        """A shaped call on the direct port: ``args`` is (its token, the call's own
        arguments). The answer is plain values (the caller's unpickler takes no
        other class); a failure answers only that it failed — its caller collects it through
        Ray, which raises it as the Ray path does."""
        try:
            token, *call_args = args
            hashed = key_of(secret)
            run = getattr(self, SHAPED_DIRECT[method])
        except (KeyError, TypeError, ValueError) as exc:
            return encode(HostError(f"not a shaped call ({type(exc).__name__})"))
        task = asyncio.ensure_future(run(sid, secret, *call_args))
        self._kept[str(token)] = (hashed, task)
        task.add_done_callback(lambda done: self._forget_later(str(token), done))
        try:
            value = await asyncio.shield(task)  # the connection may go; the call goes on
        except Exception:  # noqa: BLE001 - kept for sb_collect, which raises it
            return ("err", "shaped")
        if isinstance(value, ExecResult):
            return ("ok", (value.exit_code, value.stdout, value.stderr, value.duration_seconds))
        return ("ok", value)

    def _forget_later(self, token: str, done: asyncio.Task[Any]) -> None:
        if not done.cancelled() and done.exception() is None:  # read: never "not retrieved"
            value = done.result()
            self._kept_sizes[token] = (len(value.stdout) + len(value.stderr)
                                       if isinstance(value, ExecResult)
                                       else len(value) if isinstance(value, bytes) else 0)
        asyncio.get_running_loop().call_later(KEPT_S, self._drop_kept, token)
        ended = [t for t, (_, task) in self._kept.items() if task.done()]
        while ended and (len(ended) > KEPT_MAX
                         or sum(self._kept_sizes.values()) > KEPT_BYTES):
            self._drop_kept(ended.pop(0))

    def _drop_kept(self, token: str) -> None:
        self._kept.pop(token, None)
        self._kept_sizes.pop(token, None)

    async def sb_outcomes(self, sid: str, secret: str, tokens: list[str]) -> tuple[Any, ...]:
        """One ``Outcome`` per token, each a return of its own (shaped_direct.py: the refs a
        holder's direct calls come back as)."""
        self._session(sid, secret)  # only the sandbox's holder
        return tuple(Outcome(self.node_id, sid, secret, str(token)) for token in tokens)

    async def sb_collect(self, sid: str, secret: str, token: str) -> Any:
        """The outcome of a direct call (``shaped_call``), waited for: its value, or its
        failure raised as the Ray path raises it."""
        kept = self._kept.get(token)
        if kept is None or not hmac.compare_digest(kept[0], key_of(secret)):
            raise SandboxExecError(f"sandbox {sid[:8]}… on {self.where}: the outcome of this "
                                   f"call is no longer kept (over {KEPT_S:g} s since it ended)")
        try:
            return await asyncio.shield(kept[1])
        finally:
            if kept[1].done():
                self._drop_kept(token)

