"""One session a node actor hosts, and where its files live on the node: a private directory
per session below the node's own staging dir, swept when the actor that made it is gone.

Apart from ``node.py`` so that the node actor's parts (``node_pool.py``, ``node_shaped.py``)
use it without importing the actor that is made of them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..backends.staging import check_owned, user_dir
from ..seam.protocol import BuiltinExec
from .handshake import session_key

WORKSPACE_DIR = "workspace"  # the first entry of a copy-back archive (workspace_copy.apply)


def session_root(workdir: str, sid: str) -> str:
    """A new private directory for one session, named after this process (its owner)."""
    return tempfile.mkdtemp(prefix=f"{os.getpid()}-{sid[:8]}-", dir=workdir)


def sweep_dead_roots(workdir: str) -> list[str]:
    """Remove the session directories whose owning node actor is gone (a node killed, a
    cluster stopped with sessions open): the janitor's rule, for the node's staging dirs.
    A name without an owner pid is left alone."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(workdir):
            pid = name.partition("-")[0]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)
                removed.append(name)
    return removed


def secret_hash(secret: str) -> bytes:
    """What the node keeps of a session's secret: the key both ends of its direct connection
    prove (``handshake.session_key``), a one-way function of the secret."""
    return session_key(secret)


@dataclass
class NodeSession:
    hash: bytes
    backend: BuiltinExec
    root: str  # node-local: <root>/workspace is the backend's workspace
    orphan_timeout: float
    seen: float = field(default_factory=time.monotonic)
    calls: int = 0  # in flight: a session busy in a long call is not an orphan
    toolkit: Any = None  # a Ray-shaped sandbox's (node_shaped.py)
    workdir: str = ""  # a Ray-shaped sandbox's: where commands start, relative paths from
    expires: float | None = None  # a Ray-shaped sandbox's ttl_seconds, on the monotonic clock
    killed: bool = False  # ended from outside (toolseam ps --kill): its calls are sandbox_lost
    started: float = field(default_factory=time.time)  # wall clock: toolseam ps --ray shows it
    served: int = 0  # calls made so far (toolseam ps --ray)

    @property
    def workspace(self) -> str:
        return os.path.join(self.root, WORKSPACE_DIR)


def own_workdir(workdir: str) -> str:
    """The node's staging dir: ``workdir`` (``TOOLSEAM_RAY_WORKDIR``), made 0700 if missing —
    one another user planted or a symlink is refused (``staging.check_owned``), never used; none
    given, ``ray`` below this user's staging root (``staging.user_dir``, checked the same way),
    where no other local user can make the name first."""
    if not workdir:
        return str(user_dir("ray"))
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    check_owned(Path(workdir), os.geteuid(), exact_owner=True)
    return workdir


