"""A session's egress: its policy and proxy, the tunnel through its backend, and what the
session's commands are told (the proxy variables and the CA bundle).

``Toolkit.open`` starts it when ``limits.network`` is ``"egress"``; the rules are checked whole
here, with the credentials' values read from this process's environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from ..seam.errors import ConfigurationError
from .audit import EgressEvent
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
        open_egress = getattr(backend, "open_egress", None)
        if open_egress is None:
            raise ConfigurationError(
                f"network 'egress': the {getattr(backend, 'name', type(backend).__name__)} "
                "backend has no agent channel to carry it")
        try:
            policy = EgressPolicy.from_settings(table)
        except (EgressRuleError, ValueError) as exc:
            raise ConfigurationError(f"egress settings: {exc}") from None
        proxy = EgressProxy(policy, on_event=on_event)
        ca_pem = proxy.ca_bundle_pem() if policy.credential_hosts() else None
        try:
            where = await open_egress(proxy.handle, ca_pem, proxy.ports_for)
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

    def mark(self) -> int:
        """Where the log stands now: ``since(mark)`` is what happened after (O(1): a call's
        cost does not grow with the session's history)."""
        return self.proxy.event_count

    def since(self, mark: int) -> list[dict[str, Any]]:
        return [event_record(e) for e in self.proxy.events_since(mark)]

    async def close(self) -> None:
        await self.proxy.close()
