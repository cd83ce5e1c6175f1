"""Egress by name: a forward proxy that decides, resolves, connects and audits outside the sandbox.

This package is transport-independent: :meth:`EgressProxy.handle` serves one connection from any
asyncio stream pair. See docs/network.md.
"""

from .addresses import address_class, check_address, resolve
from .audit import EgressEvent
from .intercept import InterceptUnavailable, ca_bundle
from .proxy import EgressProxy
from .rules import CredentialRule, Decision, EgressPolicy, EgressRuleError

__all__ = [
    "CredentialRule",
    "Decision",
    "EgressEvent",
    "EgressPolicy",
    "EgressProxy",
    "EgressRuleError",
    "InterceptUnavailable",
    "address_class",
    "ca_bundle",
    "check_address",
    "resolve",
]
