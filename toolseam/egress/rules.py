"""Egress policy: which hosts a sandbox may reach, and with which credentials.

Parsed from settings-shaped input (the ``egress_*`` keys of a toolseam settings table) into an
:class:`EgressPolicy`; :meth:`EgressPolicy.decide` answers ``(host, port)`` with a
:class:`Decision` that names, when it refuses, the setting that would allow the connection. The
rule syntax is in ``patterns.py``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .patterns import (
    DEFAULT_PORTS,
    AllowRule,
    EgressRuleError,
    IPAddress,
    format_authority,
    is_host_name,
    normalize_host,
    parse_allow_rule,
    parse_ip,
)
from .placeholders import Placeholder, shaped_like

__all__ = ["DEFAULT_PORTS", "AllowRule", "CredentialRule", "Decision", "EgressPolicy",
           "EgressRuleError", "IPAddress", "format_authority", "is_host_name", "normalize_host",
           "parse_allow_rule", "parse_ip"]

# An HTTP header name (RFC 9110 token).
_HEADER = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class CredentialRule(BaseModel):
    """A header added to every request to ``host`` (its value read from the toolseam process's
    environment variable ``value_env`` when the policy is made; never from the sandbox)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str
    """The exact host name (no wildcard, no port) whose requests get the header."""
    header: str
    """The header name, e.g. ``Authorization``."""
    value_env: str
    """The name of the environment variable holding the header's value (with
    ``placeholder_env``: the token the placeholder stands for)."""
    placeholder_env: str | None = None
    """A variable set inside the sandbox to a random value of the real one's shape
    (``placeholders.py``); the proxy swaps it for the real value on the way to ``host`` only,
    instead of adding the header, and refuses it anywhere else."""
    placeholder_in: tuple[Literal["header", "url", "body"], ...] = ("header",)
    """Where the placeholder is swapped: the ``header``'s value, the request ``url``, the ``body``."""

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        host = normalize_host(value)
        if not is_host_name(host):
            raise ValueError(f"{value!r} is not a host name (credentials go to one named host)")
        return host

    @field_validator("header")
    @classmethod
    def _header(cls, value: str) -> str:
        if not _HEADER.match(value):
            raise ValueError(f"{value!r} is not an HTTP header name")
        if value.lower() in {"host", "content-length", "transfer-encoding", "connection"}:
            raise ValueError(f"{value!r} is a framing header; it cannot carry a credential")
        return value

    @field_validator("value_env", "placeholder_env")
    @classmethod
    def _value_env(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise ValueError(f"{value!r} is not an environment variable name")
        return value


@dataclass(frozen=True)
class Decision:
    """The answer for one ``(host, port)``: allowed by ``rule``, or refused with ``reason`` and
    ``hint`` (the setting that would allow it)."""

    allowed: bool
    reason: str
    hint: str = ""
    rule: str | None = None


class EgressPolicy(BaseModel):
    """The ``egress_*`` settings, validated. Credential values are read from the environment at
    construction (``os.environ``, or ``context={"environ": mapping}`` to
    :meth:`model_validate`) and kept out of ``repr``, dumps and errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    egress_allow: list[str] = Field(default_factory=list)
    """Host patterns (``HOST[:PORT]``, ``*.DOMAIN[:PORT]``); default ports 80 and 443."""
    egress_private: bool = False
    """Allow loopback, private, link-local, multicast and unique-local addresses after resolution."""
    egress_resolve: dict[str, str] = Field(default_factory=dict)
    """Name → address pins, used instead of DNS (air-gapped mirrors, tests)."""
    egress_credentials: list[CredentialRule] = Field(default_factory=list)
    """Headers added outside the sandbox to requests to the named hosts."""
    egress_ca_file: Path | None = None
    """Extra PEM roots for verifying upstream TLS of intercepted hosts (besides the system store)."""
    egress_trust_host_cas: bool = False
    """The sandbox's CA bundle also holds the host's trusted CAs and ``egress_ca_file``'s."""
    max_connections: int = Field(default=64, ge=1, le=4096)
    """Concurrent connections through the proxy; more are answered 503."""
    idle_timeout_s: float = Field(default=300.0, gt=0, le=86400)
    """A connection with no bytes either way for this long is closed."""
    connect_timeout_s: float = Field(default=15.0, gt=0, le=600)
    """Resolving and connecting upstream must finish within this."""
    log_kept: int = Field(default=10_000, ge=1, le=10_000_000)
    """Audit events kept for ``events()``; older ones are dropped (the listener sees all)."""

    _rules: tuple[AllowRule, ...] = PrivateAttr(default=())
    _pins: dict[str, IPAddress] = PrivateAttr(default_factory=dict)
    _secrets: dict[str, tuple[tuple[str, str], ...]] = PrivateAttr(default_factory=dict)
    _placeholders: tuple[Placeholder, ...] = PrivateAttr(default=())

    @field_validator("egress_allow")
    @classmethod
    def _allow(cls, value: list[str]) -> list[str]:
        for index, text in enumerate(value):
            parse_allow_rule(text, f"egress_allow[{index}]")
        return value

    @field_validator("egress_resolve")
    @classmethod
    def _resolve(cls, value: dict[str, str]) -> dict[str, str]:
        for name, address in value.items():
            host = normalize_host(name)
            if not is_host_name(host):
                raise EgressRuleError(f"egress_resolve: key {name!r} is not a host name")
            if parse_ip(normalize_host(address)) is None:
                raise EgressRuleError(f"egress_resolve[{name!r}] = {address!r} is not an IP address")
        return value

    @field_validator("egress_ca_file")
    @classmethod
    def _ca_file(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise EgressRuleError(f"egress_ca_file = {str(value)!r}: no such file on this host "
                                  "(the proxy reads it here, outside the sandbox)")
        if value is not None:
            try:  # a file that is no PEM bundle: said here, not as an SSLError at open
                ssl.create_default_context().load_verify_locations(cafile=str(value))
            except (ssl.SSLError, OSError) as exc:
                raise EgressRuleError(f"egress_ca_file = {str(value)!r}: not a PEM bundle of CA "
                                      f"certificates this host can read ({exc})") from None
        return value

    @model_validator(mode="after")
    def _derive(self, info: ValidationInfo) -> EgressPolicy:
        self._rules = tuple(parse_allow_rule(text, f"egress_allow[{i}]")
                            for i, text in enumerate(self.egress_allow))
        self._pins = {normalize_host(k): ipaddress.ip_address(normalize_host(v))
                      for k, v in self.egress_resolve.items()}
        context = info.context if isinstance(info.context, Mapping) else {}
        environ: Mapping[str, str] = context.get("environ", os.environ)
        secrets: dict[str, list[tuple[str, str]]] = {}
        placeholders: list[Placeholder] = []
        for index, rule in enumerate(self.egress_credentials):
            value = environ.get(rule.value_env)
            if value is None:
                raise EgressRuleError(
                    f"egress_credentials[{index}] (host {rule.host!r}): environment variable "
                    f"{rule.value_env} is not set in the toolseam process")
            if not value or "\r" in value or "\n" in value or "\0" in value:
                # The value is never quoted back: it is a secret.
                raise EgressRuleError(
                    f"egress_credentials[{index}] (host {rule.host!r}): {rule.value_env} is empty "
                    "or holds a line break / NUL, which cannot go in a header")
            if rule.placeholder_env is not None:
                try:
                    fake = shaped_like(value)
                except ValueError as exc:  # the value is never quoted back: it is a secret
                    raise EgressRuleError(f"egress_credentials[{index}] (host {rule.host!r}): "
                                          f"placeholder for {rule.value_env}: {exc}") from None
                placeholders.append(Placeholder(rule.host, rule.header, rule.placeholder_env,
                                                fake, value, frozenset(rule.placeholder_in)))
            else:
                secrets.setdefault(rule.host, []).append((rule.header, value))
        self._secrets = {host: tuple(pairs) for host, pairs in secrets.items()}
        self._placeholders = tuple(placeholders)
        return self

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any],
                      environ: Mapping[str, str] | None = None) -> EgressPolicy:
        """Build from a settings table; ``environ`` defaults to ``os.environ``."""
        context = {} if environ is None else {"environ": environ}
        return cls.model_validate(dict(settings), context=context)

    # -- decisions -------------------------------------------------------------------------
    def decide(self, host: str, port: int) -> Decision:
        """Allowed or refused by the rules alone (addresses are checked after resolution)."""
        name = normalize_host(host)
        authority = format_authority(name, port) if name else repr(host)
        hint = f'egress_allow = ["{authority}"]'
        if not 1 <= port <= 65535:
            return Decision(False, f"port {port} is out of range")
        address = parse_ip(name)
        if address is None and not is_host_name(name):
            return Decision(False, f"{host!r} is not a valid host name")
        for rule in self._rules:
            if rule.matches(name, port):
                return Decision(True, f"allowed by egress_allow {rule.text!r}", rule=rule.text)
        if address is not None:
            return Decision(False, "an IP address is reached only when listed literally in "
                            "egress_allow", hint)
        return Decision(False, "not in egress_allow", hint)

    def pinned(self, host: str) -> IPAddress | None:
        """The ``egress_resolve`` pin for ``host``, if any."""
        return self._pins.get(normalize_host(host))

    def credentials_for(self, host: str) -> tuple[tuple[str, str], ...]:
        """``(header, value)`` pairs to add to requests to ``host``."""
        return self._secrets.get(normalize_host(host), ())

    def credential_hosts(self) -> list[str]:
        """Hosts whose TLS the proxy terminates: credentials added or placeholders swapped."""
        return sorted({*self._secrets, *(p.host for p in self._placeholders)})

    def intercepts(self, host: str) -> bool:
        return normalize_host(host) in self.credential_hosts()

    def secret_values(self) -> list[str]:
        """Every credential value, for redaction only."""
        return [*(value for pairs in self._secrets.values() for _, value in pairs),
                *(p.value for p in self._placeholders)]

    def placeholders(self, host: str) -> tuple[Placeholder, ...]:
        """The placeholders swapped on the way to ``host``."""
        name = normalize_host(host)
        return tuple(p for p in self._placeholders if p.host == name)

    def foreign_placeholders(self, host: str) -> list[str]:
        """Stand-ins bound to other hosts: seen on the way to ``host``, the request is refused."""
        name = normalize_host(host)
        return [p.fake for p in self._placeholders if p.host != name]

    def placeholder_environment(self) -> dict[str, str]:
        """What the sandbox's commands get: each ``placeholder_env`` and its stand-in."""
        return {p.env: p.fake for p in self._placeholders}

    def ports_for(self, host: str) -> list[int]:
        """Every port some rule grants the name ``host`` (captured connections)."""
        name = normalize_host(host)
        if not is_host_name(name):
            return []
        return sorted({port for rule in self._rules for port in rule.ports
                       if rule.ip is None and rule.matches(name, port)})
