"""The provider's configuration: what an eval's ``("toolseam", {...})`` or a YAML/JSON file says."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ...backends import KnownBackend
from ...policy.limits import SandboxLimits


class ToolseamSandboxConfig(BaseModel):
    """One sandbox per sample, made from this. Unknown keys are refused, naming the key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: KnownBackend = Field(
        "podman", description="Where samples run: a name of the backend table (a container "
        "engine, or this machine: host).")
    image: str | None = Field(
        None, description="Container image; None: toolseam's default (debian:bookworm-slim).")
    rootless: bool = Field(False, description="podman: the unprivileged user's API service.")
    endpoint: str | None = Field(
        None, description="Engine address (unix://, tcp://, ssh://); None: the engine's default.")
    tls_cert_path: str | None = Field(
        None, description="docker over tcp://: a directory with ca.pem, cert.pem and key.pem "
        "(as DOCKER_CERT_PATH); None: docker's own DOCKER_TLS_VERIFY/DOCKER_CERT_PATH.")
    workspace_mode: Literal["auto", "bind", "copy"] = Field(
        "auto", description="bind for a local engine, copy for one reached over the network.")
    pull: Literal["never", "missing", "always"] | None = Field(
        None, description="Image pull policy; None: the settings' (default 'missing').")
    limits: SandboxLimits | None = Field(
        None, description="Container limits (memory, cpus, pids, network, tmpfs_size).")
    settings: dict[str, Any] = Field(
        default_factory=dict, description="A toolseam settings mapping (docs: Settings).")
    read_only_root: bool = Field(
        False, description="Mount the container's root filesystem read-only (toolseam's own "
        "default). Off here: inspect's injected tools (text_editor, bash_session) install into "
        "/var/tmp, and eval tasks expect to write outside the workspace, as under docker.")
    workspace_parent: str | None = Field(
        None, description="Where each sample's workspace dir is made; None: the temp dir.")

    def __hash__(self) -> int:
        # inspect caches sandboxes by their spec, so the config must hash; ``settings`` is a dict
        return hash(self.model_dump_json())
