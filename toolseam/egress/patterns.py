"""Host patterns: the ``egress_allow`` rule syntax and host-name helpers.

Rules (``egress_allow``) are ``HOST`` or ``HOST:PORT``:

* ``pypi.org`` — that name only, ports 80 and 443;
* ``*.pythonhosted.org`` — any name strictly below ``pythonhosted.org`` (not the name itself);
* ``github.com:22`` — that port only;
* ``10.0.0.5:8080`` / ``[fd00::1]:443`` — an IP literal, reachable only because it is listed
  literally (a wildcard never matches an address; the address checks of ``addresses.py`` still
  apply, so a private literal also needs ``egress_private = true``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

DEFAULT_PORTS: tuple[int, ...] = (80, 443)
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# RFC 1123 labels; underscores too, which real service names carry (``_dmarc``, SRV-ish hosts).
_LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")


class EgressRuleError(ValueError):
    """A malformed ``egress_*`` setting; the message names the entry."""


def normalize_host(host: str) -> str:
    """Lower-case, without a trailing dot, IPv6 without brackets."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") and not host.endswith("..") else host


def parse_ip(host: str) -> IPAddress | None:
    """The address if ``host`` (normalized) is an IP literal, else None."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def is_host_name(host: str) -> bool:
    """A syntactically valid DNS name (normalized), not an IP literal."""
    if not host or len(host) > 253 or parse_ip(host) is not None:
        return False
    labels = host.split(".")
    # An all-numeric last label is what inet_aton would read as an address ("1.2.3", "0x7f.1").
    return all(_LABEL.match(label) for label in labels) and not labels[-1].isdigit() \
        and not labels[-1].startswith("0x")


def format_authority(host: str, port: int) -> str:
    """``host:port`` with IPv6 literals bracketed."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class AllowRule:
    """One parsed ``egress_allow`` entry."""

    text: str
    host: str  # a name, the suffix of a wildcard (without "*."), or an IP literal
    wildcard: bool
    ip: IPAddress | None
    ports: tuple[int, ...]

    def matches(self, host: str, port: int) -> bool:
        if port not in self.ports:
            return False
        if self.ip is not None:
            address = parse_ip(host)
            return address is not None and address == self.ip
        if self.wildcard:
            return host.endswith("." + self.host)
        return host == self.host


def parse_allow_rule(text: str, where: str) -> AllowRule:
    """``HOST``, ``HOST:PORT``, ``*.DOMAIN[:PORT]``, ``IP[:PORT]``, ``[IPV6][:PORT]``."""
    def bad(why: str) -> EgressRuleError:
        return EgressRuleError(f"{where} = {text!r}: {why}")

    raw = text.strip()
    if not raw:
        raise bad("empty rule; write a host name such as \"pypi.org\" or \"github.com:443\"")
    if "/" in raw or "@" in raw or "://" in raw:
        raise bad("a rule is HOST or HOST:PORT, not a URL")
    port_text: str | None = None
    if raw.startswith("["):
        close = raw.find("]")
        if close < 0:
            raise bad("unclosed '[' in an IPv6 literal")
        host_text, rest = raw[1:close], raw[close + 1:]
        if rest:
            if not rest.startswith(":"):
                raise bad(f"unexpected {rest!r} after the IPv6 literal")
            port_text = rest[1:]
    elif raw.count(":") > 1:
        host_text = raw  # a bare IPv6 literal: no port possible without brackets
    elif ":" in raw:
        host_text, port_text = raw.split(":", 1)
    else:
        host_text = raw
    ports = DEFAULT_PORTS
    if port_text is not None:
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise bad(f"port {port_text!r} is not a number from 1 to 65535")
        ports = (int(port_text),)
    host = normalize_host(host_text)
    address = parse_ip(host)
    if raw.startswith("[") and not isinstance(address, ipaddress.IPv6Address):
        raise bad(f"{host_text!r} in brackets is not an IPv6 address")
    if address is not None:
        return AllowRule(text, str(address), False, address, ports)
    wildcard = host.startswith("*.")
    name = host[2:] if wildcard else host
    if "*" in name:
        raise bad("'*' is allowed only as a whole first label, as in \"*.example.org\"")
    if not is_host_name(name):
        raise bad(f"{name!r} is not a valid host name")
    if wildcard and "." not in name:
        raise bad(f"'*.{name}' would match a whole top-level domain; name the domain")
    return AllowRule(text, name, wildcard, None, ports)
