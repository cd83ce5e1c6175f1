"""A session's egress: its policy and proxy, the tunnel through its backend, and what the
session's commands are told (the proxy variables and the CA bundle).

``Toolkit.open`` starts it when ``limits.network`` is ``"egress"``; the rules are checked whole
here, with the credentials' values read from this process's environment.
"""

from __future__ import annotations

import dataclasses
import re
import ssl
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from ..seam.capabilities import egress as egress_of
from ..seam.errors import ConfigurationError
from .audit import EgressEvent
from .patterns import format_authority, is_host_name, parse_ip
from .proxy import EgressProxy
from .rules import EgressPolicy, EgressRuleError

# Every variable a common client reads for its proxy or its trusted roots.
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
NO_PROXY = "localhost,127.0.0.1"
# npm through a proxy does not trust NODE_EXTRA_CA_CERTS (measured, npm 11): its own cafile
# (the whole bundle, the image's roots included) it does.
CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
                "GIT_SSL_CAINFO", "PIP_CERT", "npm_config_cafile")


# The tool call running in this task (``Toolkit.call`` sets it): jobs started under it are its.
CURRENT_CALL: ContextVar[str | None] = ContextVar("toolseam_egress_call", default=None)
_JOBS_KEPT = 4096


# What common TLS clients print when a chain ends in a root they do not trust (OpenSSL, curl,
# Python, Node, git, pip): where a tunnel was made and this shows, the image lacks a CA.
_UNTRUSTED_CA = re.compile(
    r"CERTIFICATE_VERIFY_FAILED|certificate verify failed|SSL certificate problem|"
    r"unable to get local issuer certificate|self[- ]signed certificate|"
    r"UNABLE_TO_GET_ISSUER_CERT|SELF_SIGNED_CERT_IN_CHAIN|server certificate verification failed",
    re.IGNORECASE)
NOTES_KEPT = 8  # refused hosts named per call; more are counted


def host_roots_pem(ca_file: Path | None) -> str:
    """The CAs this process trusts (its system store, as ``ssl`` loads it, ``SSL_CERT_FILE``
    included) plus ``ca_file``'s, as PEM: what ``egress_trust_host_cas`` adds inside."""
    context = ssl.create_default_context()
    if ca_file is not None:
        context.load_verify_locations(cafile=str(ca_file))
    return "".join(ssl.DER_cert_to_PEM_cert(der)
                   for der in context.get_ca_certs(binary_form=True))


REASON_SHOWN = 160  # characters of the proxy's reason per line


def _shown(host: str, port: int) -> tuple[str, bool]:
    """The authority as the model reads it, and whether it is a real host name or address. A
    command chooses what it asks for: anything else is shown quoted, escaped and short, so it
    can neither pass for a line of ours nor flood the text."""
    if is_host_name(host) or parse_ip(host) is not None:
        return format_authority(host, port), True
    return f"{host[:40]!a}{'...' if len(host) > 40 else ''}:{port}", False


def _fix_for(record: dict[str, Any], authority: str) -> str:
    """The setting that would let this attempt through, from the reason the proxy gave (the
    limits' reasons name their setting already)."""
    reason = str(record.get("reason", ""))
    if reason.startswith(("not in egress_allow", "an IP address is reached only")):
        return f'to allow it, set egress_allow = ["{authority}"]'
    if reason.startswith("resolves to "):
        return "to allow it, set egress_private = true (only for a host meant to be private)"
    return ""


def refusal_notes(made: list[dict[str, Any]], output: str, policy: EgressPolicy,
                  tunnel_made: bool = False) -> list[str]:
    """What the model is told about one call's egress: one line per host refused or not
    reached (host, reason, the setting that would allow it), and a hint naming
    ``egress_trust_host_cas`` when a tunnel was made (``tunnel_made``: counted when made, its
    event may not be in ``made`` yet) and the output shows an untrusted CA."""
    lines: dict[str, str] = {}
    for record in made:
        status = int(record.get("status") or 0)
        if record.get("allowed") and status < 500:
            continue
        authority, real = _shown(str(record["host"]), int(record["port"]))
        if authority in lines:
            continue
        reason = str(record.get("reason", "")).split("; ", 1)[0]
        if not real:
            reason = "not a valid host name"  # the proxy's reason repeats the name
        elif len(reason) > REASON_SHOWN:
            reason = reason[:REASON_SHOWN] + "…"
        verb = "refused" if not record.get("allowed") else "could not reach"
        fix = _fix_for(record, authority) if real else ""
        lines[authority] = (f"[egress: {verb} {authority}: {reason}"
                            f"{' — ' + fix if fix else ''}]")
    notes = list(lines.values())[:NOTES_KEPT]
    if len(lines) > NOTES_KEPT:
        notes.append(f"[egress: {len(lines) - NOTES_KEPT} more hosts refused; "
                     "metadata.egress lists them]")
    tunnelled = tunnel_made or any(
        r.get("allowed") and r.get("kind") == "connect" and not r.get("intercepted") for r in made)
    if tunnelled and _UNTRUSTED_CA.search(output):
        if policy.egress_trust_host_cas:
            notes.append("[egress: a TLS certificate was not trusted inside the sandbox although "
                         "it trusts the host's CAs (egress_trust_host_cas): put the issuing CA in "
                         "egress_ca_file]")
        else:
            notes.append("[egress: a TLS certificate was not trusted inside the sandbox; if this "
                         "network inspects TLS with a CA the host trusts, set "
                         "egress_trust_host_cas = true (and egress_ca_file = its PEM, if the host's "
                         "store lacks it)]")
    return notes


@dataclasses.dataclass(frozen=True)
class EgressMark:
    """Where a call began: the audit's event count and the proxy's tunnel count."""

    events: int
    tunnels: int


def event_record(event: EgressEvent) -> dict[str, Any]:
    """An event as plain data (result metadata, ``serve``, MCP)."""
    return dataclasses.asdict(event)


class SessionEgress:
    """Built by :meth:`start`; ``environment`` goes into every command's environment."""

    def __init__(self, proxy: EgressProxy, environment: dict[str, str]) -> None:
        self.proxy = proxy
        self.environment = environment
        self.capture_problem: object = "not started"
        self.job_calls: dict[str, str] = {}  # a bash job → the tool call that started it

    def note_job(self, job: str) -> None:
        """A job is being started: remember the call it belongs to (``CURRENT_CALL``)."""
        call = CURRENT_CALL.get()
        if call is not None:
            if len(self.job_calls) >= _JOBS_KEPT:
                self.job_calls.pop(next(iter(self.job_calls)))
            self.job_calls[job] = call

    @classmethod
    async def start(cls, table: dict[str, Any], backend: object,
                    on_event: Callable[[EgressEvent], None] | None = None) -> SessionEgress:
        carrier = egress_of(backend)  # refused, naming the backend, where it has no Egress
        try:
            policy = EgressPolicy.from_settings(table)
        except (EgressRuleError, ValueError) as exc:
            raise ConfigurationError(f"egress settings: {exc}") from None
        proxy = EgressProxy(policy, on_event=on_event)
        try:
            ca_pem = proxy.ca_bundle_pem() if policy.credential_hosts() else None
            if policy.egress_trust_host_cas:  # after the image's roots and the session CA
                ca_pem = (ca_pem or "") + host_roots_pem(policy.egress_ca_file)
            where = await carrier.open_egress(proxy.handle, ca_pem, proxy.ports_for)
        except BaseException:
            await proxy.close()
            raise
        url = f"http://127.0.0.1:{where['port']}"
        environment = dict.fromkeys(PROXY_VARIABLES, url)
        environment.update(NO_PROXY=NO_PROXY, no_proxy=NO_PROXY)
        if where.get("ca_file"):
            environment.update(dict.fromkeys(CA_VARIABLES, str(where["ca_file"])))
        environment.update(policy.placeholder_environment())
        egress = cls(proxy, environment)
        egress.capture_problem = where.get("capture")  # None: every connection is captured
        proxy.call_of = egress.job_calls.get
        return egress

    def scrub(self, environment: dict[str, str]) -> list[str]:
        """Remove from a command environment every credential's variable and every variable
        whose value holds a credential value, wherever it came from (the host's environment,
        ``env_allow``, ``env_extra``); returns the names removed. Credentials stay outside."""
        policy = self.proxy.policy
        names = {rule.value_env for rule in policy.egress_credentials}
        # a placeholder's variable is set by egress itself, after this
        names |= {rule.placeholder_env for rule in policy.egress_credentials
                  if rule.placeholder_env is not None}
        secrets = policy.secret_values()
        removed = [name for name, value in environment.items()
                   if name in names or any(secret in value for secret in secrets)]
        for name in removed:
            del environment[name]
        return removed

    def events(self) -> list[EgressEvent]:
        return self.proxy.events()

    def mark(self) -> EgressMark:
        """Where the log and the tunnel count stand now: ``since(mark)`` is what happened
        after (O(1): a call's cost does not grow with the session's history)."""
        return EgressMark(self.proxy.event_count, self.proxy.tunnels_made)

    def since(self, mark: EgressMark) -> list[dict[str, Any]]:
        return [event_record(e) for e in self.proxy.events_since(mark.events)]

    def notes(self, made: list[dict[str, Any]], output: str, mark: EgressMark) -> list[str]:
        """The lines the model reads after a call's text about its refused connections; a
        tunnel made since ``mark`` counts even while it is still open (its event comes at its
        close)."""
        return refusal_notes(made, output, self.proxy.policy,
                             tunnel_made=self.proxy.tunnels_made > mark.tunnels)

    async def close(self) -> None:
        await self.proxy.close()
