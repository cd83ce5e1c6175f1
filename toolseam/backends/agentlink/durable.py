"""The host end of a durable agent (``toolseam_agent/session_socket.py``): a channel whose
connection starts with an ``attach`` proving, both ways, knowledge of the session's key without
sending it, every line after it sealed (``toolseam_agent/attach_auth.py``), and which, when its
connection drops while the client lives, attaches again with the ids of the calls still in
flight — each gets its answer (kept by the agent, or still to come) or a plain "lost" error,
never silence.

The client's own state kept with the agent (``put_state``) is sealed with a key derived from
the secret that the agent never holds: state a process inside the sandbox rewrote is refused at
the next attach (``AttachError`` "tampered"), never restored.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

from toolseam_agent.attach_auth import (
    KEY_VAR,
    Sealer,
    agent_key,
    agent_proof,
    new_nonce,
    proof_holds,
    session_key,
)
from toolseam_agent.session_socket import ATTACH, ORPHAN_VAR, STATE_PUT

from ...seam.errors import ConfigurationError, CouldNotRunError
from ...seam.handle import AttachError, attach_refused
from .channel import AgentChannel

_ATTACH_TIMEOUT_S = 10.0
_RECONNECT_S = 10.0  # how long a client that lost its connection tries to get it back


Connector = Callable[["DurableChannel"], Awaitable[None]]


def state_key(secret: str) -> bytes:
    """The key the client's kept state is sealed with: derived from the secret, never given
    to the agent (which holds only ``agent_key``)."""
    return hmac.digest(secret.encode(), b"toolseam client state v1", "sha256")


def canonical_state(state: Any) -> str:
    """The one text a state is sealed (and compared) as."""
    return json.dumps(state, sort_keys=True, separators=(",", ":"))


def seal_state(secret: str, part: str, state: Any, text: str | None = None) -> dict[str, str]:
    """``state`` sealed; ``text``: its ``canonical_state``, when the caller has it already."""
    text = canonical_state(state) if text is None else text
    mac = hmac.digest(state_key(secret), part.encode() + b"\0" + text.encode(), "sha256")
    return {"sealed": text, "mac": mac.hex()}


def open_state(secret: str, part: str, kept: Any) -> Any:
    """The state kept as ``part``, once its seal holds; ``AttachError("tampered")`` otherwise."""
    if isinstance(kept, dict) and isinstance(kept.get("sealed"), str):
        text = kept["sealed"]
        mac = hmac.digest(state_key(secret), part.encode() + b"\0" + text.encode(), "sha256")
        if proof_holds(mac.hex(), kept.get("mac")):
            return json.loads(text)
    raise AttachError("tampered", f"the session's kept {part!r} state does not carry this "
                      "handle's seal: a process in the sandbox changed it, so none of it is "
                      "restored; nothing was stopped (the session ends itself after its orphan "
                      "timeout, or when its owner shuts it down)")


def durable_agent_env(secret: str, orphan_timeout_s: float) -> dict[str, str]:
    """What a durable agent is started with: the key derived from the secret (never the
    secret: ``toolseam_agent/attach_auth.py``) and its orphan timeout."""
    return {KEY_VAR: agent_key(secret).hex(), ORPHAN_VAR: repr(float(orphan_timeout_s))}


async def _unix_connector(channel: DurableChannel) -> None:
    """Connect by hand: on a unix socket whose backlog is full a non-blocking connect fails
    with EAGAIN, which asyncio would take for "in progress" and hand back unconnected."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    deadline = time.monotonic() + _ATTACH_TIMEOUT_S
    try:
        while True:
            try:
                sock.connect(channel.path)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.01)
        await channel._loop.create_unix_connection(lambda: channel, sock=sock)
        channel.passes_descriptors = True  # the agent's own listening socket
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        sock.close()
        raise AttachError("ended", f"no session is listening at {channel.path} "
                                   f"({exc.strerror}): it ended") from None
    except OSError as exc:
        sock.close()
        raise CouldNotRunError(f"cannot connect to the session at {channel.path}: {exc}",
                               retryable=True) from None


class DurableChannel(AgentChannel):
    """An ``AgentChannel`` to a durable agent listening at ``path``."""

    def __init__(self, endpoint: str, path: str, secret: str,
                 connector: Connector | None = None) -> None:
        super().__init__(endpoint)
        self.path = path
        self._secret = secret
        self._connector = connector or _unix_connector
        self.attached: dict[str, Any] = {}  # the last attach answer: state, jobs, next_id
        self._ending = False  # shutdown or detach: a lost connection is not reattached
        self._reconnecting: asyncio.Task[None] | None = None
        self._attaching: asyncio.Future[dict[str, Any]] | None = None  # an attach's answer
        self.reconnects = 0

    @classmethod
    async def attach(cls, path: str, endpoint: str, secret: str,
                     connector: Connector | None = None) -> DurableChannel:
        """A channel attached to the agent at ``path`` (``AttachError`` when refused; a socket
        that is not there means the session ended). ``connector`` makes the connection when
        it is not a unix socket on this machine (copy mode: an exec of the relay)."""
        channel = cls(endpoint, path, secret, connector)
        await channel._attach([])
        return channel

    async def _attach(self, pending: list[int]) -> None:
        self.death = None
        self._splitter.reset()
        self._seal = self._unseal = None
        self._lost = self._loop.create_future()
        await self._connector(self)
        key = agent_key(self._secret)
        mine = new_nonce()
        challenge = await self._step({"op": ATTACH, "nonce": mine})
        theirs = challenge.get("nonce")
        if not isinstance(theirs, str) or not proof_holds(agent_proof(key, mine, theirs),
                                                          challenge.get("proof")):
            self._abort()
            raise AttachError("wrong_secret", f"the agent at {self.path} did not prove it knows "
                              "this session's key: the handle's secret is not this session's, "
                              "or something other than the session's agent answers there")
        session = session_key(key, mine, theirs)
        self._seal, self._unseal = Sealer(session, b"C"), Sealer(session, b"A")
        attached = await self._step({"op": ATTACH, "pending": pending})  # sealed: our proof
        self.attached = attached
        first = int(self.attached.get("next_id", 1))
        current = next(self._ids)
        self._ids = itertools.count(max(first, current))

    def kept_state(self, part: str) -> Any:
        """The client state the agent kept as ``part`` (None if none), once its seal holds:
        ``AttachError("tampered")`` if something in the sandbox changed it."""
        kept = (self.attached.get("state") or {}).get(part)
        return None if kept is None else open_state(self._secret, part, kept)

    def _abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    async def _step(self, request: dict[str, Any]) -> dict[str, Any]:
        """One step of the attach: its answer's result, or the refusal raised."""
        rid = f"attach-{time.monotonic_ns()}"
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._pending[rid] = future  # type: ignore[index]
        self._attaching = future
        try:
            assert self._transport is not None
            payload = json.dumps({"id": rid, **request}).encode()
            self._transport.write((self._seal.seal(payload) if self._seal else payload) + b"\n")
            answer = await asyncio.wait_for(future, _ATTACH_TIMEOUT_S)
        except TimeoutError:
            self._abort()
            raise AttachError("protocol", f"{self.path} did not answer an attach: not a "
                                          "session of this toolseam") from None
        except CouldNotRunError as closed:
            raise CouldNotRunError(f"the connection to the session at {self.path} closed "
                                   f"during the attach: {closed.reason}", retryable=True) from None
        finally:
            self._pending.pop(rid, None)  # type: ignore[call-overload]
            self._attaching = None
        if not answer.get("ok"):
            self._abort()
            raise attach_refused(answer.get("error") or {})
        return dict(answer["result"])

    async def put_state(self, state: Any, key: str = "toolkit", text: str | None = None) -> None:
        """Store a part of the client's state with the agent, sealed (the next attach hands
        every part back, by key, once its seal holds: ``kept_state``). ``text``: the state's
        ``canonical_state``, when the caller made it already."""
        await self.call(STATE_PUT, key=key, state=seal_state(self._secret, key, state, text))

    async def call(self, op: str, pass_fd: int | None = None, **fields: Any) -> dict[str, Any]:
        if self._reconnecting is not None and not self._reconnecting.done():
            await asyncio.shield(self._reconnecting)
        return await super().call(op, pass_fd, **fields)

    def connection_lost(self, exc: Exception | None) -> None:
        attaching = self._attaching
        if attaching is not None and not attaching.done():  # only this attempt failed
            attaching.set_exception(CouldNotRunError(str(exc or "end of stream"),
                                                     retryable=True))
            self._transport = None
            if not self._lost.done():
                self._lost.set_result(None)
            return
        if self._ending or self.death is not None or not self.attached:
            super().connection_lost(exc)
            return
        # The client lives, the agent may too: keep the calls in flight, attach again.
        self._transport = None
        if self.ports is not None:  # an exposed port's streams end with the connection
            self.ports.carrying = False
            self.ports.end_all()
        self.resume_writing()
        if not self._lost.done():
            self._lost.set_result(None)
        self._reconnecting = self._loop.create_task(self._reconnect(exc))

    async def _reconnect(self, cause: Exception | None) -> None:
        deadline = time.monotonic() + _RECONNECT_S
        why = f"lost the connection to the session at {self.path}: {cause or 'closed'}"
        while True:
            try:
                await self._attach([rid for rid in self._pending if isinstance(rid, int)])
                self.reconnects += 1
                if self.ports is not None:
                    self.ports.carrying = True
                return
            except AttachError as refused:
                if refused.reason != "in_use" or time.monotonic() > deadline:
                    why = f"{why}; attaching again failed: {refused}"
                    break
            except CouldNotRunError as failed:
                if time.monotonic() > deadline:
                    why = f"{why}; attaching again failed: {failed.reason}"
                    break
            await asyncio.sleep(0.05)  # the agent has not seen the old connection end yet
        self._die(why)
        if not self._lost.done():
            self._lost.set_result(None)

    async def detach(self, drain_s: float = 5.0) -> None:
        """End this connection only: the agent and its jobs go on."""
        self._ending = True
        await self.close(drain_s)

    async def shutdown(self, answer_s: float = 5.0, drain_s: float = 10.0) -> None:
        if self._reconnecting is not None:
            with contextlib.suppress(Exception):
                await self._reconnecting
        self._ending = True
        await super().shutdown(answer_s, drain_s)


class DurableMethods:
    """The ``seam.capabilities.DurableSessions`` methods a backend with a durable channel
    writes the same way; the backend says where its channel is (``_durable_channel``)."""

    def durable_channel(self) -> DurableChannel:
        """The open durable session's channel (``ConfigurationError`` if there is none)."""
        raise NotImplementedError

    async def keep_state(self, part: str, state: Any, text: str | None = None) -> None:
        await self.durable_channel().put_state(state, part, text)

    def kept_state(self, part: str) -> Any:
        return self.durable_channel().kept_state(part)

    def attached_jobs(self) -> list[dict[str, Any]]:
        return list(self.durable_channel().attached.get("jobs") or ())

    async def keep_backend_state(self) -> None:
        """Nothing beyond the toolkit's own (copy mode keeps its baseline: its override)."""


def the_durable(channel: object) -> DurableChannel:
    if not isinstance(channel, DurableChannel):
        raise ConfigurationError("the session is not open as a durable session")
    return channel
