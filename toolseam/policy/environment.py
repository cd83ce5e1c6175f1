"""The environment a command gets: the host's, minus anything that looks like a secret.

A variable whose name ends in ``_KEY`` (or is ``KEY``) or contains ``TOKEN``, ``SECRET``,
``PASSWORD``, ``PASSWD``, ``CREDENTIAL`` or ``PRIVATE`` is dropped unless the host allow-lists
it by name. The sandbox's own bookkeeping variables never pass through either.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_SECRET = re.compile(r"(^|_)KEY$|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|PRIVATE", re.IGNORECASE)
_RESERVED_PREFIX = "TOOLSEAM_"


def looks_secret(name: str) -> bool:
    return _SECRET.search(name) is not None


def command_environment(source: Mapping[str, str], allow: Iterable[str] = (),
                        extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``source`` filtered by the secret rule (``allow`` names pass), then ``extra`` on top."""
    allowed = set(allow)
    env = {name: value for name, value in source.items()
           if not name.startswith(_RESERVED_PREFIX)
           and (name in allowed or not looks_secret(name))}
    env.update(extra or {})
    return env


CONTAINER_BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "HOME": "/tmp",
}
