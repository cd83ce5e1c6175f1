"""``toolseam mcp --http``: streamable HTTP, and never an open door.

Over HTTP, bash is a shell for whoever reaches the port — and on a shared machine every local
user reaches ``127.0.0.1``. So a TCP listener, loopback included, always wants a bearer token
(``Authorization: Bearer …``, compared in constant time; otherwise 401 with
``WWW-Authenticate``): the operator's, from ``--auth-token-file`` or ``TOOLSEAM_MCP_TOKEN``, or
on loopback, when none is given, one generated into an owner-only file whose path the start-up
line names (``listen.py``). A non-loopback address without the operator's own token is refused at
start. ``unix:PATH`` serves on a unix socket of mode 0600 instead, where the file mode is the
check. ``GET /metrics`` (Prometheus, ``metrics.py``) wants the same token. The SDK's own hooks
do the token work: a ``TokenVerifier`` behind its
``BearerAuthBackend`` and ``RequireAuthMiddleware`` (decisions 59, 60, 330). The SDK's
Host/Origin checks (DNS rebinding) stay on for every loopback address.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import os
import signal
import sys
from collections.abc import Callable, MutableMapping
from pathlib import Path
from types import FrameType
from typing import Any

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.transport_security import TransportSecuritySettings

from ..._extras import install_hint
from ...backends.staging import read_private_text
from ...seam.errors import ConfigurationError
from ...session.toolkit import Toolkit
from .listen import TcpAddress, UnixAddress, generate_token_file, listen_tcp, listen_unix, remove_socket
from .metrics import ServerMetrics
from .server import McpTools, build_server

TOKEN_ENV = "TOOLSEAM_MCP_TOKEN"
MIN_TOKEN_CHARS = 32  # `openssl rand -hex 32` gives 64
REAP_EVERY_SECONDS = 60.0


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost: not known to stay on this machine
        return False


def read_tokens(token_file: str | None, environ: MutableMapping[str, str]) -> list[str]:
    """The bearer tokens: the file's lines (one token per line, each a principal with its own
    sandboxes), else ``TOOLSEAM_MCP_TOKEN`` (then removed from this process's environment so no
    command inherits it), else none."""
    if token_file:
        source = f"--auth-token-file {token_file}"
        text = read_private_text(token_file, source)
        tokens = [line.strip() for line in text.splitlines() if line.strip()] or [""]
    elif TOKEN_ENV in environ:
        source, tokens = TOKEN_ENV, [environ.pop(TOKEN_ENV).strip()]
    else:
        return []
    for number, token in enumerate(tokens, 1):
        where = source if len(tokens) == 1 else f"{source} line {number}"
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigurationError(f"{where}: the token has {len(token)} characters; use at "
                                     f"least {MIN_TOKEN_CHARS} random ones (e.g. openssl rand -hex 32)")
        if not token.isprintable() or any(c.isspace() for c in token):
            raise ConfigurationError(f"{where}: the token must be one line of printable "
                                     "characters without spaces")
    return tokens


def read_token(token_file: str | None, environ: MutableMapping[str, str]) -> str | None:
    """The first bearer token (``read_tokens``), or None."""
    tokens = read_tokens(token_file, environ)
    return tokens[0] if tokens else None


def principal_of(token: str) -> str:
    """A token's principal: a digest, so no sandbox table holds the secret itself."""
    return "token-" + hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class StaticToken:
    """The SDK's ``TokenVerifier`` for the configured secrets; each token is its own client."""

    def __init__(self, *tokens: str) -> None:
        self._tokens = [token.encode("utf-8", "surrogatepass") for token in tokens]

    async def verify_token(self, token: str) -> AccessToken | None:
        given = token.encode("utf-8", "surrogatepass")
        # every comparison made, whichever matches: the time says nothing about which one did
        matches = [hmac.compare_digest(given, known) for known in self._tokens]
        if any(matches):
            return AccessToken(token=token, client_id=principal_of(token), scopes=[])
        return None


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _loopback_checks(host: str) -> TransportSecuritySettings:
    hosts = {"127.0.0.1", "localhost", "[::1]", _url_host(host)}
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=[f"{h}:*" for h in sorted(hosts)],
        allowed_origins=[f"http://{h}:*" for h in sorted(hosts)])


async def _reap(tools: McpTools) -> None:
    while True:
        await asyncio.sleep(REAP_EVERY_SECONDS)
        await tools.close_idle()


def _no_host_checks() -> TransportSecuritySettings:
    """A unix socket: no browser can reach it, so no DNS rebinding; clients name any Host."""
    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


def serve_http(factory: Callable[[], Toolkit], address: TcpAddress | UnixAddress,
               approvals: bool = False, *, token_file: str | None = None, shared: bool = False,
               branching: bool = False, environ: MutableMapping[str, str] = os.environ) -> None:
    """Streamable HTTP at ``http://HOST:PORT/mcp`` (or path ``/mcp`` on a unix socket) until
    interrupted. Raises ``ConfigurationError`` — before listening — for a non-loopback address
    without the operator's token, a bad token, or an address it cannot listen on."""
    try:
        import uvicorn
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
        raise ConfigurationError(f"--http needs the {exc.name!r} package: "
                                 f"{install_hint('mcp')}") from None

    tokens = read_tokens(token_file, environ)
    if isinstance(address, TcpAddress) and not tokens and not is_loopback(address.host):
        raise ConfigurationError(
            f"refusing --http {address.host}:{address.port}: not a loopback address, and anyone "
            "who reaches it could run commands here; set a bearer token (--auth-token-file PATH "
            f"or {TOKEN_ENV}), or listen on 127.0.0.1 or unix:PATH")
    metrics = ServerMetrics()  # first: it instruments the process the sessions report to
    server, tools = build_server(factory, approvals, shared, branching=branching)
    generated: Path | None = None
    checks: TransportSecuritySettings | None
    if isinstance(address, UnixAddress):
        sock = listen_unix(address.path)
        bound, host = f"unix:{address.path}", "localhost"
        checks = _no_host_checks()
    else:
        sock = listen_tcp(address.host, address.port)
        host = address.host
        bound = f"http://{_url_host(host)}:{sock.getsockname()[1]}"
        checks = _loopback_checks(host) if is_loopback(host) else None
        if not tokens:  # loopback: every local user reaches it, so a token all the same
            try:
                token, generated = generate_token_file()
            except (OSError, ConfigurationError) as exc:
                sock.close()
                raise ConfigurationError(f"--http {address.host}:{address.port}: no token given "
                                         f"and none could be generated: {exc}") from None
            tokens = [token]
    app_options: dict[str, Any] = {"host": host, "transport_security": checks,
                                   "custom_starlette_routes": [metrics.route()]}
    if tokens:  # the SDK wants an issuer; with no OAuth server and no resource URL it is never shown
        app_options.update(token_verifier=StaticToken(*tokens),
                           auth=AuthSettings(issuer_url=bound if bound.startswith("http")
                                             else "http://localhost", resource_server_url=None))
    app = server.streamable_http_app(**app_options)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(f"toolseam mcp: {banner(address, bound, len(tokens), generated)}", file=sys.stderr,
          flush=True)

    async def run() -> None:
        reaper = asyncio.ensure_future(_reap(tools))
        try:
            await uvicorn.Server(config).serve(sockets=[sock])
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await tools.close_all()

    # uvicorn re-raises a SIGTERM it shut down for once it is done: ending the process there
    # would skip what follows (the sandboxes' close, the socket and token file removed).
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        asyncio.run(run())
    finally:
        signal.signal(signal.SIGTERM, previous)
        metrics.close()
        sock.close()
        if isinstance(address, UnixAddress):
            remove_socket(address.path)
        if generated is not None:
            with contextlib.suppress(OSError):
                generated.unlink()


def _exit_on_sigterm(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def banner(address: TcpAddress | UnixAddress, bound: str, tokens: int,
           generated: Path | None) -> str:
    """The start-up line: where, and what a client must show — never the token itself."""
    if isinstance(address, UnixAddress):
        where = f"listening on unix socket {address.path}, path /mcp"
        guard = ("mode 0600: this user only" if not tokens else
                 "mode 0600: this user only, and a bearer token")
    else:
        where = f"listening on {bound}/mcp"
        if generated is not None:
            guard = (f"bearer token required: generated into {generated}, readable by this user "
                     f"only; clients send 'Authorization: Bearer <the file's line>'")
        else:
            guard = (f"bearer token required ({tokens} clients)" if tokens > 1 else
                     "bearer token required")
    return f"{where} ({guard})"
