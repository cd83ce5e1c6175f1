"""The docker backend, through the docker SDK. Same sandbox, same agent, same engine code: only
the dialect (``containers/docker_dialect.py``) is docker's."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .._extras import install_hint
from ..seam.errors import BackendUnavailable

try:  # the engine SDK is an extra: say what to install, not a bare ModuleNotFoundError
    from .containers.engine.docker_dialect import DockerDialect
except ModuleNotFoundError as exc:
    raise BackendUnavailable(f"the docker backend needs the {exc.name!r} package: "
                             f"{install_hint('docker')}") from None

from ..policy.limits import SandboxLimits
from ..seam.lifetime import EPHEMERAL, BackendLifetime
from .containers.backend import ContainerBackend
from .containers.engine.attach import TlsFiles
from .containers.engine.protocol import Hardening
from .containers.engine.pull import PullCallback, PullPolicy
from .containers.engine.sdk import SdkEngine
from .containers.options import DEFAULT_IMAGE, ContainerOptions, Pooled, SetidFiles
from .containers.sandbox import WorkspaceMode


class DockerEngine(SdkEngine):
    """A docker engine: the one ``SdkEngine`` with docker-py's dialect."""

    def __init__(self, endpoint: str, tls: TlsFiles | None = None) -> None:
        """``tls``: client certificate, key and CA as docker's own client takes them
        (``TlsFiles.from_env()`` reads ``DOCKER_CERT_PATH``/``DOCKER_TLS_VERIFY``)."""
        super().__init__(DockerDialect(), endpoint, tls)


def docker_engine(endpoint: str | None = None, tls: TlsFiles | None = None) -> DockerEngine:
    """The engine at ``endpoint``, else ``TOOLSEAM_DOCKER_URL``, ``DOCKER_HOST``, the local
    socket; TLS from docker's own variables for a TCP endpoint given none."""
    url = (endpoint or os.environ.get("TOOLSEAM_DOCKER_URL") or os.environ.get("DOCKER_HOST")
           or "unix:///var/run/docker.sock")
    if tls is None and url.startswith(("tcp://", "https://")):
        tls = TlsFiles.from_env()
    return DockerEngine(url, tls)


class DockerBackend(ContainerBackend):
    """``DockerBackend(workspace, image=..., endpoint=...)``."""

    def __init__(self, workspace: str = ".", *, image: str = DEFAULT_IMAGE,
                 endpoint: str | None = None, hardening: Hardening | None = None,
                 limits: SandboxLimits | None = None, pull: PullPolicy = "missing",
                 auth: dict[str, str] | None = None,
                 on_pull_progress: PullCallback | None = None,
                 workspace_mode: WorkspaceMode = "auto", tls: TlsFiles | None = None,
                 copy_limit: int | None = None,
                 agent_bundles: Mapping[str, str] | None = None,
                 copy_keep_group_write: bool = False, setid_files: SetidFiles = None,
                 provisioning: Pooled | None = None,
                 lifetime: BackendLifetime = EPHEMERAL, session_id: str | None = None) -> None:
        """``endpoint``: ``unix://…``, ``tcp://host:port`` (with ``tls``, or docker's own
        ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``), ``https://`` or
        ``ssh://[user@]host[:port][/path/to/docker.sock]`` (through the system's ssh); default
        ``TOOLSEAM_DOCKER_URL``, then ``DOCKER_HOST``, then the local socket.
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
        super().__init__(docker_engine(endpoint, tls), "docker", os.path.abspath(workspace),
                         options)


__all__ = ["DockerBackend", "DockerEngine", "Hardening"]
