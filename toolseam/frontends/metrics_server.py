"""``toolseam metrics --listen HOST:PORT``: a Prometheus ``/metrics`` endpoint over every live
session of this user on this machine (``observability/prometheus.py``, made with the
OpenTelemetry SDK's Prometheus reader; the ``otel`` extra). A listener proves who is on the
other end: every request must carry the bearer token of ``--token-file`` (mode 0600; Prometheus
sends it with ``authorization: {credentials_file: ...}``), on loopback too."""

from __future__ import annotations

import argparse

from .._extras import install_hint
from ..backends.staging import read_private_text
from ..seam.errors import BackendUnavailable, ConfigurationError

MIN_TOKEN_CHARS = 32

def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = commands.add_parser(
        "metrics", help="serve the live sessions' metrics for Prometheus (/metrics)",
        description="A Prometheus endpoint over every live session of this user on this "
        "machine: CPU, memory, processes, calls by outcome, egress by host.")
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--token-file", required=True, metavar="PATH",
                        help="the bearer token every scrape must carry (a 0600 file)")
    parser.set_defaults(handler=run)


def read_token(path: str) -> str:
    where = f"--token-file {path}"
    token = read_private_text(path, where).strip()
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or " " in token:
        raise ConfigurationError(f"{where}: the token must be one line of at least "
                                 f"{MIN_TOKEN_CHARS} printable characters without spaces "
                                 "(e.g. openssl rand -hex 32)")
    return token


def run(args: argparse.Namespace) -> int:
    token = read_token(args.token_file)
    try:
        from ..observability.prometheus import make_server  # the otel extra: loaded only here
    except ImportError as exc:
        raise BackendUnavailable(f"toolseam metrics needs the otel extra ({exc.name} is "
                                 f"missing): {install_hint('otel')}") from None

    server = make_server(args.listen, token)
    host, port = server.server_address[:2]
    print(f"toolseam metrics: http://{host!s}:{port}/metrics (bearer token required)",
          flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
