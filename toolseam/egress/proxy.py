"""The egress proxy: serves one inbound connection at a time from any asyncio stream pair.

``handle(reader, writer)`` is all a transport calls — a TCP listener in tests, the tunnel over a
session's channel later. It serves ``CONNECT host:port`` (a plain tunnel, or for a host with
credentials a TLS termination that adds them) and absolute-URI plain HTTP requests
(``GET http://host/path``), one request per client connection (``Connection: close``), so every
request is decided, and credentials are added to exactly the requests meant for their host.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from . import http1
from .audit import AuditLog, EgressEvent, Kind, Redactor, attribute
from .intercept import SessionCA, ca_bundle, upstream_context
from .relay import Connection, forward, tunnel
from .rules import EgressPolicy, normalize_host
from .upstream import ProxyRefusal, Upstream, open_upstream, refused

_CLOSED_READ_S = 1.0
_CLOSE_WAIT_S = 10.0  # how long close waits for aborted connections' handlers to finish


class EgressProxy:
    """Decides, resolves, connects and audits; see the module docstring."""

    def __init__(self, policy: EgressPolicy, *,
                 on_event: Callable[[EgressEvent], None] | None = None) -> None:
        self.policy = policy
        self._redactor = Redactor(policy.secret_values())
        self._audit = AuditLog(self._redactor, on_event, policy.log_kept)
        hosts = policy.credential_hosts()
        self._ca = SessionCA(hosts) if hosts else None
        self._upstream_tls: ssl.SSLContext | None = (
            upstream_context(policy.egress_ca_file) if hosts else None)
        self._active: set[Connection] = set()
        self._closed = False
        self._refused_names: set[str] = set()  # audited once each
        # Plain CONNECT tunnels made so far, counted when made: an attempt's event is recorded
        # when its connection ends, which can be after the call that made it has its result
        # (the gateway-CA hint needs to know a tunnel was made; issue 45).
        self.tunnels_made = 0
        self.call_of: Callable[[str], str | None] = lambda _job: None  # a job → its tool call

    def ca_bundle_pem(self, roots: Iterable[str] = ()) -> str:
        """The PEM the sandbox must trust: ``roots`` (the image's own) then the session CA, or
        just ``roots`` when no host has credentials (nothing is intercepted)."""
        if self._ca is None:
            return "".join(root.strip() + "\n" for root in roots if root.strip())
        return ca_bundle(self._ca.ca_pem(), roots)

    def events(self) -> list[EgressEvent]:
        """The attempts kept (the last ``log_kept``), oldest first; ``on_event`` sees all."""
        return self._audit.events()

    @property
    def event_count(self) -> int:
        """Attempts recorded so far, kept or not."""
        return self._audit.count

    def events_since(self, count: int) -> list[EgressEvent]:
        """The attempts recorded after the first ``count`` that are still kept."""
        return self._audit.since(count)

    @property
    def active_connections(self) -> int:
        return len(self._active)

    async def close(self) -> None:
        """Refuse new connections and end every open one (tunnels included)."""
        self._closed = True
        for connection in list(self._active):
            connection.abort("the proxy was closed")
        waits = [asyncio.ensure_future(connection.done.wait()) for connection in self._active]
        if waits:  # bounded: a handler that never ends must not hold the session's close
            _, late = await asyncio.wait(waits, timeout=_CLOSE_WAIT_S)
            for wait in late:
                wait.cancel()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     opened: dict[str, Any] | None = None) -> None:
        """Serve one inbound connection until it ends; never raises for a client's doing.
        ``opened``: where a captured connection was dialled (``egress_target``) and who opened
        it (``egress_origin``) — given by egress's lane; else the transport is asked."""
        began = time.monotonic()
        connection = Connection(writer)
        if self._closed:
            # The head is read (briefly) only so that closing does not reset the answer away.
            with contextlib.suppress(TimeoutError, OSError, ValueError, asyncio.IncompleteReadError):
                async with asyncio.timeout(_CLOSED_READ_S):
                    await http1.read_head(reader)
            writer.write(http1.error_response(503, "toolseam egress: the proxy is closed"))
            await connection.release()
            return
        over = len(self._active) >= self.policy.max_connections
        self._active.add(connection)
        watchdog = asyncio.create_task(self._watch(connection))
        event: EgressEvent | None = None
        def told(name: str) -> Any:
            return opened.get(name) if opened is not None else writer.get_extra_info(name)

        captured = told("egress_target")
        try:
            if captured is not None:  # a program dialled a name's synthetic address
                connection.raw = True
                event = EgressEvent(host=normalize_host(captured[0]), port=captured[1], kind="tcp")
                attribute(event, told("egress_origin"), self.call_of)
                if over:
                    raise ProxyRefusal(503, f"more than egress_max_connections = "
                                       f"{self.policy.max_connections} connections at once", "")
                await self._captured(connection, event, reader, writer)
                return
            head = await http1.read_head(reader)
            if head is None:
                return
            event, target = self._event_for(head)
            attribute(event, told("egress_origin"), self.call_of)
            if over:
                why = (f"more than egress_max_connections = {self.policy.max_connections} "
                       "connections at once; wait, or raise egress_max_connections")
                raise ProxyRefusal(503, why, f"toolseam egress: {why}\n")
            if event.kind == "connect":
                await self._connect(connection, event, reader, writer)
            else:
                await self._http(connection, event, reader, writer, head, target)
        except ProxyRefusal as refusal:
            await self._answer(connection, writer, refusal.status, refusal.body, event,
                               refusal.reason)
        except http1.BadRequest as error:
            await self._answer(connection, writer, 400, f"toolseam egress: bad request: {error}\n",
                               event, f"bad request: {error}")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as error:
            if event is not None and not event.reason.startswith("ended"):
                event.reason = f"{event.reason}; connection ended: {type(error).__name__}"
        finally:
            watchdog.cancel()
            await connection.release()
            self._active.discard(connection)
            connection.done.set()
            if event is not None:
                if connection.ended_by:
                    event.reason = f"{event.reason}; ended: {connection.ended_by}"
                self._audit.record(event, began)

    # -- the two request kinds -------------------------------------------------------------
    def _event_for(self, head: http1.Head) -> tuple[EgressEvent, str]:
        parts = head.start.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise http1.BadRequest(f"not an HTTP/1.x request line: {head.start[:100]!r}")
        method, target, _version = parts
        kind: Kind = "connect" if method == "CONNECT" else "http"
        if kind == "http" and not target.lower().startswith("http://"):
            raise http1.BadRequest(
                "an https:// URL must be reached with CONNECT" if target.lower().startswith("https://")
                else f"{target[:100]!r} is not an absolute http:// URL or CONNECT target")
        try:
            # urlsplit and its properties raise ValueError for a bad bracket or port.
            split = urlsplit("//" + target if kind == "connect" else target)
            port = split.port or (80 if kind == "http" else None)
            host = normalize_host(split.hostname or "")
            userinfo = split.username is not None or split.password is not None
        except ValueError as error:
            raise http1.BadRequest(f"{target[:100]!r}: {error}") from None
        if userinfo:
            raise http1.BadRequest("user information in the URL is not forwarded")
        if not host or port is None:
            raise http1.BadRequest(f"{target[:100]!r} names no host and port")
        return EgressEvent(host=host, port=port, kind=kind), target

    def _decide(self, event: EgressEvent) -> None:
        decision = self.policy.decide(event.host, event.port)
        event.reason = decision.reason
        if not decision.allowed:
            raise refused(event.host, event.port, decision.reason, decision.hint)
        event.allowed = True  # by the rules; an address refusal below takes it back

    async def _upstream(self, connection: Connection, event: EgressEvent,
                        tls: ssl.SSLContext | None) -> Upstream:
        upstream = await open_upstream(event.host, event.port, self.policy, tls)
        connection.writers.append(upstream.writer)
        event.address = upstream.address
        connection.touch()
        return upstream

    async def _connect(self, connection: Connection, event: EgressEvent,
                       reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._decide(event)
        credentials = self.policy.credentials_for(event.host)
        intercept = self.policy.intercepts(event.host) and self._ca is not None
        upstream = await self._upstream(connection, event,
                                        self._upstream_tls if intercept else None)
        event.status, event.intercepted = 200, intercept
        connection.answered = True
        writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        await writer.drain()
        if not intercept:
            self.tunnels_made += 1
            await tunnel(connection, event, reader, writer, upstream,
                         self.policy.foreign_placeholders(event.host))
            return
        await self._intercept(connection, event, reader, writer, upstream, credentials)

    async def _intercept(self, connection: Connection, event: EgressEvent,
                         reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         upstream: Upstream, credentials: tuple[tuple[str, str], ...]) -> None:
        """TLS with the session CA to the client, then its one request, credentials added."""
        assert self._ca is not None
        try:
            await writer.start_tls(self._ca.server_context(event.host))
        except (ssl.SSLError, OSError) as error:
            # The client did not trust the session CA (it ignores SSL_CERT_FILE, or pins its own
            # roots): its connection ends, the session and every other connection go on.
            connection.ended_by = f"TLS handshake with the sandbox's client failed: {error}"
            return
        connection.answered = False  # a new layer: the client now awaits an HTTP answer in TLS
        await self._origin_request(connection, event, reader, writer, upstream, credentials)

    async def _origin_request(self, connection: Connection, event: EgressEvent,
                              reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              upstream: Upstream, credentials: tuple[tuple[str, str], ...]) -> None:
        """An origin-form request (``GET /path``) for ``event.host`` alone, forwarded."""
        head = await http1.read_head(reader)
        if head is None:
            return
        method, _, target = head.start.partition(" ")
        target = target.rsplit(" ", 1)[0]
        if not target.startswith("/"):
            raise ProxyRefusal(400, "not an origin-form request inside the tunnel",
                               "toolseam egress: expected an origin-form request\n")
        try:
            host = normalize_host(urlsplit("//" + (head.get("host") or "")).hostname or "")
        except ValueError:
            host = ""
        if host != event.host:
            raise ProxyRefusal(421, f"Host {host!r} inside a tunnel to {event.host!r}",
                               f"toolseam egress: this tunnel leads to {event.host} only\n")
        await forward(connection, event, reader, writer, head, f"{method} {target}",
                      upstream, credentials, self.policy.placeholders(event.host),
                      self.policy.foreign_placeholders(event.host))

    async def _captured(self, connection: Connection, event: EgressEvent,
                        reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A captured connection: no request to parse, the name and port are known. Bytes pass
        as they are, except to a host with credentials: HTTPS on any port but 80 (TLS
        terminated, as for CONNECT), plain HTTP on 80; its one request gets them."""
        self._decide(event)
        credentials = self.policy.credentials_for(event.host)
        intercept = self.policy.intercepts(event.host) and self._ca is not None and event.port != 80
        upstream = await self._upstream(connection, event,
                                        self._upstream_tls if intercept else None)
        event.status, event.intercepted = 200, intercept
        transport = writer.transport
        if not intercept and isinstance(transport, asyncio.ReadTransport):
            transport.resume_reading()  # the tunnel held the first bytes for a TLS layer
        if intercept:
            await self._intercept(connection, event, reader, writer, upstream, credentials)
        elif self.policy.intercepts(event.host) and event.port == 80:
            await self._origin_request(connection, event, reader, writer, upstream, credentials)
        else:
            await tunnel(connection, event, reader, writer, upstream,
                         self.policy.foreign_placeholders(event.host))

    def ports_for(self, name: str) -> list[int]:
        """The resolver's question (captured connections): the ports ``name`` may reach. A
        name granted none is audited as refused here (once), since no connection follows."""
        host = normalize_host(name)
        ports = self.policy.ports_for(host)
        if not ports and not self._closed and host not in self._refused_names:
            self._refused_names.add(host)
            reason = self.policy.decide(host, 443).reason
            event = EgressEvent(host=host or repr(name), port=0, kind="dns", reason=(
                f"{reason}; the sandbox's resolver answered that the name does not exist "
                f'(egress_allow = ["{host}"] would allow it)'))
            self._audit.record(event, time.monotonic())
        return ports

    async def _http(self, connection: Connection, event: EgressEvent, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter, head: http1.Head, target: str) -> None:
        self._decide(event)
        upstream = await self._upstream(connection, event, None)
        split = urlsplit(target)
        origin = (split.path or "/") + (f"?{split.query}" if split.query else "")
        method = head.start.split(" ", 1)[0]
        head.remove("host")
        head.headers.insert(0, ("Host", split.netloc.rsplit("@", 1)[-1]))
        await forward(connection, event, reader, writer, head, f"{method} {origin}", upstream,
                      self.policy.credentials_for(event.host), self.policy.placeholders(event.host),
                      self.policy.foreign_placeholders(event.host))

    # -- helpers ----------------------------------------------------------------------------
    async def _answer(self, connection: Connection, writer: asyncio.StreamWriter, status: int,
                      body: str, event: EgressEvent | None, reason: str) -> None:
        if connection.answered or (event is not None and event.status == 403):
            # Mid-answer, or refused already (a placeholder cut mid-body): the status stands;
            # only the reason is kept.
            if event is not None:
                event.reason = f"{event.reason}; ended: {reason}"
            return
        if event is not None:
            event.status, event.reason = status, reason
            if status == 403:
                event.allowed = False
        if connection.raw:  # a captured connection: its program expects no HTTP, just the end
            return
        with contextlib.suppress(OSError, RuntimeError):
            writer.write(http1.error_response(status, self._redactor.scrub(body)))
            await writer.drain()

    async def _watch(self, connection: Connection) -> None:
        idle = self.policy.idle_timeout_s
        while True:
            remaining = connection.last + idle - time.monotonic()
            if remaining <= 0:
                connection.abort(f"no bytes either way for egress_idle_timeout_s = {idle:g} seconds")
                return
            await asyncio.sleep(remaining)
