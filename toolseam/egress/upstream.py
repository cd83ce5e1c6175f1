"""Opening the upstream connection: resolve, check each address, connect to a checked one."""

from __future__ import annotations

import asyncio
import os
import ssl
from dataclasses import dataclass

from .addresses import ResolveError, check_address, resolve
from .rules import EgressPolicy, format_authority


class ProxyRefusal(Exception):
    """The proxy answers the client with ``status`` and ``body`` instead of connecting."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.body = body


def refused(host: str, port: int, reason: str, hint: str) -> ProxyRefusal:
    authority = format_authority(host, port)
    body = (f"toolseam egress refused {authority}: {reason}.\n"
            f"To allow it, set in the toolseam settings: {hint}\n")
    return ProxyRefusal(403, reason, body)


def bad_gateway(host: str, port: int, reason: str, status: int = 502) -> ProxyRefusal:
    return ProxyRefusal(status, reason,
                        f"toolseam egress could not reach {format_authority(host, port)}: {reason}\n")


@dataclass
class Upstream:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    address: str


async def open_upstream(host: str, port: int, policy: EgressPolicy,
                        tls: ssl.SSLContext | None) -> Upstream:
    """Connect to ``host:port`` through a checked address. Raises ProxyRefusal (403 for an address
    the policy refuses, 502 when nothing answers, 504 on the connect timeout)."""
    try:
        async with asyncio.timeout(policy.connect_timeout_s):
            return await _open(host, port, policy, tls)
    except TimeoutError:
        raise bad_gateway(host, port, f"no connection within connect_timeout_s = "
                          f"{policy.connect_timeout_s:g} seconds", 504) from None


async def _open(host: str, port: int, policy: EgressPolicy, tls: ssl.SSLContext | None) -> Upstream:
    try:
        addresses = await resolve(host, port, policy)
    except ResolveError as error:
        raise bad_gateway(host, port, str(error)) from None
    failures: list[str] = []
    refusal: str | None = None
    for address in addresses:
        why = check_address(address, policy)
        if why is not None:
            refusal = refusal or why
            continue
        try:
            # An IP literal: the socket connects to exactly the address just checked.
            reader, writer = await asyncio.open_connection(
                str(address), port, ssl=tls, server_hostname=host if tls else None,
                limit=1024 * 1024)
        except ssl.SSLCertVerificationError as error:
            raise bad_gateway(host, port, f"TLS verification failed at {address}: "
                              f"{error.verify_message} (trusted: the system store and "
                              "egress_ca_file)") from None
        except ssl.SSLError as error:
            raise bad_gateway(host, port, f"TLS failed at {address}: {error.reason}") from None
        except OSError as error:
            failures.append(f"{address}: {os.strerror(error.errno) if error.errno else error}")
            continue
        return Upstream(reader, writer, str(address))
    if failures:
        raise bad_gateway(host, port, "could not connect (" + "; ".join(failures) + ")")
    assert refusal is not None
    raise refused(host, port, refusal, "egress_private = true (and only if this host is meant "
                  "to reach private addresses)")
