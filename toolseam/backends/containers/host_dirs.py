"""The host side of a container session's paths: the workspace (and a pool's base dir) is a
directory of THIS machine that the sandbox sees as ``/workspace``. An error about one says it
was looked for on this host, and — for a path that looks like the sandbox's own — what to pass
instead (issue 33; ``session/path_sides.py`` is the sandbox side)."""

from __future__ import annotations

import os

from ...seam.errors import ConfigurationError
from .labels import WORKSPACE


def check_host_dir(path: str, what: str) -> None:
    """Raise ``ConfigurationError`` unless ``path`` (``what``: "the workspace", "base_dir") is
    a directory on this host."""
    if os.path.isdir(path):
        return
    problem = "is not a directory" if os.path.exists(path) else "does not exist"
    if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        hint = (f"{path} is a path inside the sandbox: pass the host directory to appear at "
                f"{WORKSPACE}, and a directory inside it as the Toolkit's base_dir")
    else:
        hint = f"it is the host directory the sandbox sees as {WORKSPACE}: pass an existing one"
    raise ConfigurationError(f"{what} {path} {problem} on this host ({hint})")
