"""Which side a path was looked for on, in the errors that name one (issue 33).

A container session has two filesystems: this host's (the workspace given to the backend, a
settings file, an upload's source) and the sandbox's (``base_dir``, a command's ``cwd``, which
start at ``/workspace``). The host backend has one. A path looked for on the wrong side was
refused as "does not exist" while the user could ``ls`` it; these say where it was looked for
and, when the path names something on the other side, what to pass instead.
"""

from __future__ import annotations

import os

from ..seam.models import SandboxInfo


def side(info: SandboxInfo | None) -> str:
    """Where a session's paths are looked for: this host's filesystem, or the sandbox's."""
    return "on this host" if info is None or info.local else "inside the sandbox"


def missing_in_sandbox_hint(info: SandboxInfo | None, given: str, option: str) -> str:
    """For ``given`` (as the caller passed ``option``) that a container's sandbox did not
    find: what to pass instead — the workspace, when it is a host directory — else where the
    sandbox's paths start. Empty for the host backend (one side only)."""
    if info is None or info.local or not given.startswith(("/", "~")):
        return ""  # a relative path is relative to the sandbox's own base dir: no confusion
    workspace = info.workspace
    host = os.path.abspath(os.path.expanduser(given))
    if os.path.isdir(host) and not (host == workspace or host.startswith(workspace + "/")):
        return (f" (it is a host directory: pass it as the workspace — "
                f"backend_options={{'workspace': {host!r}}} or the backend's first argument, "
                f"which the sandbox sees as {workspace} — and {option} only for a directory "
                "inside the sandbox)")
    return (f" ({option} is a path inside the sandbox; the host directory given as the "
            f"workspace is {workspace} there)")
