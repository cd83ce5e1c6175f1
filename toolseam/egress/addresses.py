"""Resolution and the check of the address actually connected to.

A rule allows a *name*; what the name resolves to is checked separately, on the very address the
socket then connects to (a resolved IP literal, so no second lookup can swap it): a public name
that resolves to 127.0.0.1 or to the cloud metadata address 169.254.169.254 is refused unless
``egress_private = true``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket

from .rules import EgressPolicy, IPAddress, normalize_host, parse_ip

# The stdlib properties, in the order a refusal names them; ``is_global`` last catches the ranges
# no property names (shared address space 100.64/10, documentation, benchmarking ...).
_CLASSES = (
    ("unspecified", "is_unspecified"),
    ("loopback", "is_loopback"),
    ("link-local", "is_link_local"),
    ("multicast", "is_multicast"),
    ("reserved", "is_reserved"),
    ("unique-local/site-local", "is_site_local"),
    ("private", "is_private"),
)
_UNIQUE_LOCAL = ipaddress.ip_network("fc00::/7")
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class ResolveError(OSError):
    """The name did not resolve (or resolved to nothing usable)."""


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 form carries: IPv4-mapped, 6to4, NAT64, IPv4-compatible."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _SIX_TO_FOUR:
        return address.sixtofour
    if address in _NAT64 or int(address) >> 32 == 0:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def address_class(address: IPAddress) -> str | None:
    """Why ``address`` is not a public one (``"loopback"``, ``"link-local"`` ...), or None."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.is_loopback or address.is_unspecified:
            return "loopback" if address.is_loopback else "unspecified"
        inner = embedded_ipv4(address)
        if inner is not None:
            why = address_class(inner)
            return f"{why} (IPv4 {inner} inside {address})" if why else None
        if address in _UNIQUE_LOCAL:
            return "unique-local"
    for name, attribute in _CLASSES:
        if getattr(address, attribute, False):
            return name
    return None if address.is_global else "non-global"


def check_address(address: IPAddress, policy: EgressPolicy) -> str | None:
    """The refusal reason for connecting to ``address``, or None when it may be connected to."""
    why = address_class(address)
    if why is None or policy.egress_private:
        return None
    return f"resolves to {address}, a {why} address"


async def resolve(host: str, port: int, policy: EgressPolicy) -> list[IPAddress]:
    """Addresses for ``host``: the literal itself, the ``egress_resolve`` pin, else DNS
    (``getaddrinfo`` in the toolseam process), in the resolver's order, without duplicates."""
    name = normalize_host(host)
    literal = parse_ip(name)
    if literal is not None:
        return [literal]
    pin = policy.pinned(name)
    if pin is not None:
        return [pin]
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except socket.gaierror as error:
        raise ResolveError(f"could not resolve {name}: {error.strerror}") from None
    found: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise ResolveError(f"could not resolve {name}: no addresses")
    return found
