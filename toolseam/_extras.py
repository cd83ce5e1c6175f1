"""What to install when an optional extra is missing.

toolseam is not on a public package index, so ``pip install 'toolseam[podman]'`` would fail for
most users. The message names the extra's own requirements instead (read from the installed
metadata, so it cannot drift from pyproject.toml) — those ARE on the index — and how to reinstall
toolseam itself with the extra.
"""

from __future__ import annotations

import re
from importlib import metadata

_EXTRA = re.compile(r"""^(?P<requirement>[^;]+);\s*extra\s*==\s*["'](?P<extra>[\w-]+)["']\s*$""")
# Where the metadata cannot be read (a source tree never installed): pyproject.toml's lists.
_FALLBACK = {
    "podman": ["podman>=5.0", "requests>=2.28"],
    "docker": ["docker>=7.0", "requests>=2.28"],
    "mcp": ["mcp>=2.3,<3", "mcp-types>=2.3,<3", "uvicorn>=0.31"],
    "egress": ["cryptography>=42"],
    "ray": ["ray[default]>=2.60"],
    "otel": ["opentelemetry-api>=1.45,<2", "opentelemetry-sdk>=1.45,<2",
             "opentelemetry-exporter-otlp-proto-http>=1.45,<2",
             "opentelemetry-exporter-prometheus>=0.66b0", "prometheus-client>=0.20"],
}


def extra_requirements(extra: str) -> list[str]:
    """The requirement strings the installed distribution lists for ``extra``."""
    try:
        lines = metadata.requires("toolseam") or []
    except metadata.PackageNotFoundError:
        return list(_FALLBACK.get(extra, []))
    found = []
    for line in lines:
        match = _EXTRA.match(line)
        if match and match["extra"] == extra:
            found.append(match["requirement"].strip())
    return found or list(_FALLBACK.get(extra, []))


def install_hint(extra: str) -> str:
    """``pip install 'podman>=5.0' 'requests>=2.28' (the toolseam[podman] extra; or reinstall
    toolseam from its checkout or wheel with [podman])``."""
    quoted = " ".join(f"'{requirement}'" for requirement in extra_requirements(extra))
    return (f"pip install {quoted} (the toolseam[{extra}] extra; or reinstall toolseam from "
            f"its checkout or wheel with [{extra}])")
