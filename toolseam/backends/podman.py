"""The podman backend, rootful or rootless, through podman-py and the podman API service.

Rootless is the same code with another endpoint: the API service of the unprivileged user
(``unix:///run/user/UID/podman/podman.sock``). Container root maps to that user, so files the
sandbox creates in the workspace belong to the user and stay editable and removable by them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .._extras import install_hint
from ..seam.errors import BackendUnavailable

try:  # the engine SDK is an extra: say what to install, not a bare ModuleNotFoundError
    from .containers.engine.podman_dialect import PodmanDialect
except ModuleNotFoundError as exc:
    raise BackendUnavailable(f"the podman backend needs the {exc.name!r} package: "
                             f"{install_hint('podman')}") from None

from ..policy.limits import SandboxLimits
from ..seam.lifetime import EPHEMERAL, BackendLifetime
from .containers.backend import ContainerBackend
from .containers.engine.protocol import Hardening
from .containers.engine.pull import PullCallback, PullPolicy
from .containers.engine.sdk import SdkEngine
from .containers.options import DEFAULT_IMAGE, ContainerOptions, Pooled, SetidFiles
from .containers.sandbox import WorkspaceMode


def default_endpoint(rootless: bool) -> str:
    if rootless or os.geteuid() != 0:
        runtime = os.environ.get("XDG_RUNTIME_DIR", f"/run/user/{os.geteuid()}")
        return f"unix://{runtime}/podman/podman.sock"
    return "unix:///run/podman/podman.sock"


class PodmanEngine(SdkEngine):
    """A podman engine: the one ``SdkEngine`` with podman-py's dialect."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(PodmanDialect(), endpoint)


def podman_engine(endpoint: str | None = None, rootless: bool = False) -> PodmanEngine:
    """The engine at ``endpoint``, else ``TOOLSEAM_PODMAN_URL`` (``…_ROOTLESS_URL``), else
    the default socket."""
    variable = "TOOLSEAM_PODMAN_ROOTLESS_URL" if rootless else "TOOLSEAM_PODMAN_URL"
    return PodmanEngine(endpoint or os.environ.get(variable) or default_endpoint(rootless))


class PodmanBackend(ContainerBackend):
    """``PodmanBackend(workspace, image=..., endpoint=..., rootless=...)``."""

    def __init__(self, workspace: str = ".", *, image: str = DEFAULT_IMAGE,
                 endpoint: str | None = None, rootless: bool = False,
                 hardening: Hardening | None = None, limits: SandboxLimits | None = None,
                 pull: PullPolicy = "missing", auth: dict[str, str] | None = None,
                 on_pull_progress: PullCallback | None = None,
                 workspace_mode: WorkspaceMode = "auto", copy_limit: int | None = None,
                 agent_bundles: Mapping[str, str] | None = None,
                 copy_keep_group_write: bool = False, setid_files: SetidFiles = None,
                 provisioning: Pooled | None = None,
                 lifetime: BackendLifetime = EPHEMERAL, session_id: str | None = None) -> None:
        """``endpoint``: ``unix://…``, ``tcp://host:port`` (podman's API service) or
        ``ssh://[user@]host[:port][/path/to/podman.sock]`` (default ``/run/podman/podman.sock``).
        ``copy_keep_group_write``: copy mode brings group/other write bits home (by default
        they are dropped; set-id and sticky bits never come). ``setid_files``: whether commands
        may make set-user/group-ID files — None, the mode's default: yes in copy mode (they
        never come home), no in bind mode; "allow" in bind mode only where container root is
        not host root (rootless podman); "refuse" everywhere (docs/security.md, decision 146).
        ``lifetime``: ``Ephemeral`` (default) or ``Durable`` — a session that outlives its
        client (``seam/lifetime.py``), chosen here, never changed after. ``session_id``: names
        the container and its session label (a caller's own session's id, which its cleanup
        finds it by); None, a fresh one."""
        options = ContainerOptions(
            image=image, hardening=hardening, limits=limits, pull=pull, auth=auth,
            on_pull_progress=on_pull_progress, workspace_mode=workspace_mode,
            copy_limit=copy_limit, agent_bundles=dict(agent_bundles or {}),
            copy_keep_group_write=copy_keep_group_write, setid_files=setid_files,
            provisioning=provisioning, lifetime=lifetime, session_id=session_id)
        super().__init__(podman_engine(endpoint, rootless),
                         "podman-rootless" if rootless else "podman",
                         os.path.abspath(workspace), options)


__all__ = ["Hardening", "PodmanBackend", "PodmanEngine"]
