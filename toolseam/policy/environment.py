"""The environment a command gets: the host's, minus anything that looks like a secret.

A variable is dropped when its NAME or its VALUE looks secret, unless the host allow-lists it by
name (``Settings.env_allow`` — the one way to pass a secret to commands on purpose):

* names, matched case-insensitively, as whole ``_``-separated words (so ``KEYBOARD``,
  ``PASSTHROUGH``, ``AUTHOR`` and ``PWD`` itself pass): ``KEY``/``APIKEY``/``ACCESSKEY``,
  ``PASS``/``PWD`` after another word (``MYSQL_PWD``, ``SMTP_PASS``), ``AUTH`` (``NPM_CONFIG__AUTH``,
  ``SSH_AUTH_SOCK``), ``DSN``, ``COOKIE``, ``SALT``, ``JWT``, ``BEARER``, ``WEBHOOK``; and
  anywhere in the name: ``TOKEN``, ``SECRET``, ``PASSWORD``, ``PASSWD``, ``PASSPHRASE``,
  ``CREDENTIAL``, ``PRIVATE``, ``APIKEY``/``API_KEY``; plus the agent sockets ``SSH_AUTH_SOCK``
  and ``GPG_AGENT_INFO``;
* values: a URL carrying a password (``scheme://user:password@host``, e.g. a ``DATABASE_URL``),
  a connection string with ``password=``/``pwd=``, a PEM private key, and tokens whose prefix
  says what they are (GitHub ``ghp_``/``github_pat_``, GitLab ``glpat-``, Slack ``xox?-``,
  AWS ``AKIA…``, OpenAI/Stripe ``sk-``/``sk_live_``, npm ``npm_``, Google ``AIza``).

The sandbox's own bookkeeping variables (``TOOLSEAM_*``) never pass through either.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

# A secret word as a whole word of the name: "_" or the name's ends on both sides.
_WORD = r"(?:^|_)(?:{})(?:_|$)"
_SECRET_NAME = re.compile("|".join((
    _WORD.format("KEY|KEYS|APIKEY|ACCESSKEY|AUTH|DSN|COOKIE|COOKIES|SALT|JWT|BEARER|WEBHOOK"),
    r"_(?:PASS|PWD)(?:_|$)",  # after another word: MYSQL_PWD, SMTP_PASS (PWD, OLDPWD pass)
    r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|API_?KEY",
    r"^(?:SSH_AUTH_SOCK|GPG_AGENT_INFO)$",
)), re.IGNORECASE)

_SECRET_VALUE = re.compile("|".join((
    r"[a-z][a-z0-9+.-]*://[^/?#@\s:]*:[^/?#@\s]+@",  # scheme://user:password@
    r"(?:^|[\s;])(?:password|pwd)\s*=\s*[^\s;]",  # libpq / ODBC connection strings
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}|\bgithub_pat_\w{20,}|\bglpat-[\w-]{20,}",
    r"\bxox[abposr]-[\w-]{10,}|\bAKIA[0-9A-Z]{16}\b|\bsk[-_](?:live_|proj-)?[\w-]{20,}",
    r"\bnpm_[A-Za-z0-9]{36}\b|\bAIza[\w-]{35}",
)), re.IGNORECASE)
_RESERVED_PREFIX = "TOOLSEAM_"


def looks_secret(name: str, value: str = "") -> bool:
    """Whether a variable (its name, or its value) looks like it carries a credential."""
    return _SECRET_NAME.search(name) is not None or _SECRET_VALUE.search(value) is not None


def command_environment(source: Mapping[str, str], allow: Iterable[str] = (),
                        extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``source`` filtered by the secret rule (``allow`` names pass), then ``extra`` on top."""
    allowed = set(allow)
    env = {name: value for name, value in source.items()
           if not name.startswith(_RESERVED_PREFIX)
           and (name in allowed or not looks_secret(name, value))}
    env.update(extra or {})
    return env


CONTAINER_BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",
}
