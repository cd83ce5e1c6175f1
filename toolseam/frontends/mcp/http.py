"""``toolseam mcp --http``: streamable HTTP, and never an open door.

Over HTTP, bash is a shell for whoever reaches the port. A loopback address (127.0.0.0/8, ::1,
``localhost``) is reachable from this machine only and needs nothing more; any other address is
refused at start unless a bearer token is configured — read from ``--auth-token-file`` or
``TOOLSEAM_MCP_TOKEN`` — and once one is, every request must carry it
(``Authorization: Bearer …``, compared in constant time) or get 401 with ``WWW-Authenticate``.
The SDK's own hooks do that work: a ``TokenVerifier`` behind its ``BearerAuthBackend`` and
``RequireAuthMiddleware`` (decisions 59, 60). The SDK's Host/Origin checks (DNS rebinding) stay
on for every loopback address.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import ipaddress
import os
import socket
import stat
import sys
from collections.abc import Callable, MutableMapping
from pathlib import Path

from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.transport_security import TransportSecuritySettings

from ...seam.errors import ConfigurationError
from ...session.toolkit import Toolkit
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
        try:
            mode = os.stat(token_file).st_mode
            text = Path(token_file).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigurationError(f"{source}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ConfigurationError(f"{source}: not UTF-8 text") from None
        if mode & 0o077:
            raise ConfigurationError(f"{source}: other users can read or change it (mode "
                                     f"{stat.S_IMODE(mode):o}); chmod 600 it")
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


def _listen(host: str, port: int) -> socket.socket:
    """Bind and listen now, so a taken port is a one-line error and the line we print is true."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise ConfigurationError(f"--http {host}:{port}: {exc.strerror}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _loopback_checks(host: str) -> TransportSecuritySettings:
    hosts = {"127.0.0.1", "localhost", "[::1]", _url_host(host)}
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=[f"{h}:*" for h in sorted(hosts)],
        allowed_origins=[f"http://{h}:*" for h in sorted(hosts)])


async def _reap(tools: McpTools) -> None:
    while True:
        await asyncio.sleep(REAP_EVERY_SECONDS)
        await tools.close_idle()


def serve_http(factory: Callable[[], Toolkit], host: str, port: int, approvals: bool = False, *,
               token_file: str | None = None, shared: bool = False,
               environ: MutableMapping[str, str] = os.environ) -> None:
    """Streamable HTTP at ``http://HOST:PORT/mcp`` until interrupted. Raises
    ``ConfigurationError`` — before listening — for a non-loopback address without a token,
    a bad token, or an address it cannot listen on."""
    try:
        import uvicorn
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
        from ..._extras import install_hint

        raise ConfigurationError(f"--http needs the {exc.name!r} package: "
                                 f"{install_hint('mcp')}") from None

    host = host.removeprefix("[").removesuffix("]")
    if not 0 <= port <= 65535:  # getaddrinfo would take 99999 as 34463
        raise ConfigurationError(f"--http {host}:{port}: a port is 0-65535")
    tokens = read_tokens(token_file, environ)
    token = tokens[0] if tokens else None
    if token is None and not is_loopback(host):
        raise ConfigurationError(
            f"refusing --http {host}:{port}: not a loopback address, and anyone who reaches it "
            f"could run commands here; set a bearer token (--auth-token-file PATH or {TOKEN_ENV}) "
            "or listen on 127.0.0.1")
    server, tools = build_server(factory, approvals, shared)
    sock = _listen(host, port)
    bound = f"http://{_url_host(host)}:{sock.getsockname()[1]}"
    if token is None:
        app = server.streamable_http_app(host=host, transport_security=_loopback_checks(host))
    else:  # the SDK wants an issuer; with no OAuth server and no resource URL it is never shown
        app = server.streamable_http_app(
            host=host, transport_security=_loopback_checks(host) if is_loopback(host) else None,
            token_verifier=StaticToken(*tokens),
            auth=AuthSettings(issuer_url=bound, resource_server_url=None))
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    guard = (f"bearer token required ({len(tokens)} clients)" if len(tokens) > 1 else
             "bearer token required" if token else "loopback only, no token")
    print(f"toolseam mcp: listening on {bound}/mcp ({guard})", file=sys.stderr, flush=True)

    async def run() -> None:
        reaper = asyncio.ensure_future(_reap(tools))
        try:
            await uvicorn.Server(config).serve(sockets=[sock])
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await tools.close_all()

    try:
        asyncio.run(run())
    finally:
        sock.close()
