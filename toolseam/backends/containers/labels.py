"""The names a container sandbox leaves on the engine and the host: the labels every janitor reads
(who owns a container, which session, kept work, pools, durable sessions), the paths inside
the container, and the owner label's meaning — a process on this machine, by pid and start time.
Kept apart from ``sandbox.py`` so the janitor, the pool's mounts and the modes read them
without importing the sandbox."""

from __future__ import annotations

import socket

import psutil

from ..owner import still_runs

OWNER_LABEL = "toolseam.owner"
SESSION_LABEL = "toolseam.session"
# A session that outlives its client (lifetimes/durable.py): no owner label (any process
# may attach; its agent ends it after its orphan timeout); the janitor removes it once stopped.
DURABLE_LABEL = "toolseam.orphan_timeout_s"
WORKSPACE = "/workspace"
AGENT_MOUNT = "/opt/toolseam"
SOCKET_MOUNT = "/run/toolseam"
AGENT_VOLUME_LABEL = "toolseam.agent"
# Work kept after a failed copy-back: engines cannot relabel a container or volume, so a
# marker volume carries the labels (no owner label: no janitor takes it for an orphan).
# A durable session being closed (a volume with the closing process as owner): its stopped
# container is the closing client's copy-back source, not a session that ended by itself.
CLOSING_LABEL = "toolseam.closing"
KEPT_LABEL = "toolseam.kept"  # unix time it was kept
KEPT_CONTAINER_LABEL = "toolseam.kept.container"
KEPT_VOLUME_LABEL = "toolseam.kept.volume"
KEPT_WORKSPACE_LABEL = "toolseam.kept.workspace"  # the host dir the work was going to
KEPT_RETENTION_S = 7 * 24 * 3600  # then the janitor removes it (docs/containers.md)
# a fork's start image (fork_image.py): its maker's owner label, for the janitor
FORK_IMAGE_LABEL = "toolseam.fork-image"
POOL_LABEL = "toolseam.pool"  # the SandboxPool a pre-warmed sandbox belongs to (pool.py)
SOCKET_DIR_PREFIX = "toolseam-sock-"  # a bind-mode session's socket directory on the host


def owner_label() -> str:
    """host:pid:start-time — a pid alone could be reused by an unrelated process."""
    me = psutil.Process()
    return f"{socket.gethostname()}:{me.pid}:{me.create_time():.3f}"


def owner_is_gone(label: str) -> bool:
    host, _, rest = label.partition(":")
    pid_text, _, started = rest.partition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False  # another machine's container is not ours to judge
    try:
        return not still_runs(int(pid_text), float(started))
    except ValueError:
        return True  # a label of ours with no start time: its maker cannot be told apart
