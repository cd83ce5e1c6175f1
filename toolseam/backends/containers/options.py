"""What a container backend is configured with: one frozen, keyword-only object, validated once
when it is made, and read — never re-checked — by everything after."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ...policy.limits import SandboxLimits
from ...seam.errors import ConfigurationError
from ...seam.lifetime import EPHEMERAL, BackendLifetime, Durable, Ephemeral
from .engine.protocol import Hardening
from .engine.pull import PULL_POLICIES, PullCallback, PullPolicy
from .pool.mounts import SlotMounts
from .sandbox import WORKSPACE_MODES, WorkspaceMode
from .workspace_sync.policy import DEFAULT_COPY_LIMIT

# A public, widely cached base any engine can pull: the agent brings its own runtime, so the
# image needs no python; Debian slim has bash and the usual tools commands expect.
DEFAULT_IMAGE = "docker.io/library/debian:bookworm-slim"
# Whether commands may make set-user-ID / set-group-ID files (decision 146): None is the mode's
# default — allowed in copy mode (the copy-back strips the bits), refused in bind mode.
SetidFiles = Literal["refuse", "allow"] | None
SETID_FILES = ("refuse", "allow", None)
SESSION_ID = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")  # a part of container and volume names


@dataclass(frozen=True)
class Pooled:
    """How a pool provisions its sandboxes (``pool/warm.py``): started before the workspace
    exists, labelled as the pool's, the workspace handed in later — in bind mode mounted onto
    the sandbox's slot, in ``mounts``' mount namespace. Fresh sandboxes have none of this."""

    pool_id: str
    mounts: SlotMounts


@dataclass(frozen=True, kw_only=True)
class ContainerOptions:
    """A container backend's options (the engine and the workspace aside)."""

    image: str = DEFAULT_IMAGE
    hardening: Hardening | None = None  # None: the defaults (CONTRACT §9)
    limits: SandboxLimits | None = None  # the host's limits: override hardening's, and enforced
    pull: PullPolicy = "missing"
    auth: dict[str, str] | None = None  # None: the engine's own credentials
    on_pull_progress: PullCallback | None = None
    workspace_mode: WorkspaceMode = "auto"
    copy_limit: int | None = None  # None: DEFAULT_COPY_LIMIT
    agent_bundles: Mapping[str, str] = field(default_factory=dict)  # arch -> bundle dir
    copy_keep_group_write: bool = False  # copy mode brings group/other write bits home
    setid_files: SetidFiles = None  # commands making set-id files (decision 146)
    provisioning: Pooled | None = None  # None: fresh, the workspace there at the start
    lifetime: BackendLifetime = EPHEMERAL  # how long the sandbox lives (seam/lifetime.py)
    session_id: str | None = None  # the container's name and label; None: a fresh one

    def __post_init__(self) -> None:
        if self.pull not in PULL_POLICIES:
            raise ConfigurationError(f"pull policy must be one of {', '.join(PULL_POLICIES)}, "
                                     f"got {self.pull!r}")
        if self.workspace_mode not in WORKSPACE_MODES:
            raise ConfigurationError(f"workspace_mode must be one of {', '.join(WORKSPACE_MODES)}, "
                                     f"got {self.workspace_mode!r}")
        if self.setid_files not in SETID_FILES:
            raise ConfigurationError(f"setid_files must be 'refuse', 'allow' or None (the "
                                     f"mode's default), got {self.setid_files!r}")
        if not isinstance(self.lifetime, Ephemeral | Durable):
            raise ConfigurationError("lifetime must be toolseam.seam.lifetime's Ephemeral() or "
                                     f"Durable(...), got {type(self.lifetime).__name__}")
        if self.provisioning is not None and isinstance(self.lifetime, Durable):
            raise ConfigurationError("orphan_timeout_s: a pool's sandbox is started as an "
                                     "ordinary one, before any session; a session that "
                                     "outlives its client starts its own")
        if self.session_id is not None and not SESSION_ID.fullmatch(self.session_id):
            raise ConfigurationError("session_id names a container: 1-64 of a-z, 0-9, '_', "
                                     f"'.', '-', starting with a letter or digit, got "
                                     f"{self.session_id!r}")
        if self.copy_limit is not None and self.copy_limit <= 0:
            raise ConfigurationError(
                f"copy_limit must be a positive number of bytes, got {self.copy_limit}")

    @property
    def sandbox_hardening(self) -> Hardening:
        """The hardening the container gets: the host's limits over the defaults."""
        hardening = self.hardening or Hardening()
        if self.limits is None:
            return hardening
        return dataclasses.replace(hardening, limits=self.limits)

    @property
    def enforce_limits(self) -> bool:
        """The host set limits: refuse a sandbox the engine left unlimited."""
        return self.limits is not None and self.limits.sets_resources

    @property
    def copy_bytes(self) -> int:
        return self.copy_limit or DEFAULT_COPY_LIMIT
