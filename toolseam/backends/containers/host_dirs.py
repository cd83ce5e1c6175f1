"""The host side of a container session's paths: the workspace (and a pool's base dir) is a
directory of THIS machine that the sandbox sees as ``/workspace``. An error about one says it
was looked for on this host, and — for a path that looks like the sandbox's own — what to pass
instead (issue 33; ``session/path_sides.py`` is the sandbox side)."""

from __future__ import annotations

import os

from ...seam.errors import ConfigurationError, CouldNotRunError
from .labels import WORKSPACE


def host_dir_problem(path: str, what: str) -> str | None:
    """Why ``path`` (``what``: "the workspace", "base_dir") is not a directory on this host,
    in one line saying so and what to pass; None when it is one."""
    if os.path.isdir(path):
        return None
    problem = "is not a directory" if os.path.exists(path) else "does not exist"
    if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
        hint = (f"{path} is a path inside the sandbox: pass the host directory to appear at "
                f"{WORKSPACE}, and a directory inside it as the Toolkit's base_dir")
    else:
        hint = f"it is the host directory the sandbox sees as {WORKSPACE}: pass an existing one"
    return f"{what} {path} {problem} on this host ({hint})"


def check_workspace(path: str) -> None:
    """A session's workspace: could-not-run, not retryable (the verdict every engine gave
    before, now said before any engine is asked, in copy mode too)."""
    problem = host_dir_problem(path, "the workspace")
    if problem is not None:
        raise CouldNotRunError(problem, retryable=False)


def check_pool_base_dir(path: str) -> None:
    """A pool hand-out's base dir: a ``ConfigurationError`` (nothing was started for it)."""
    problem = host_dir_problem(path, "base_dir")
    if problem is not None:
        raise ConfigurationError(problem)
