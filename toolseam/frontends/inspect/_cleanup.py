"""Finding and removing what the provider made: containers and volumes labelled with a session
id of ours (``inspect-…``) on the engines this machine names, and the samples' workspace dirs.

A session id names the process that made it (``inspect-PID-STARTTIME-RANDOM``), so
``inspect sandbox cleanup toolseam`` without an id removes what evals that have ended left
behind (``--no-sandbox-cleanup``, a crash) and spares the sandboxes of an eval still running on
this machine — another eval's samples must not die because somebody cleaned up.

``inspect sandbox cleanup toolseam`` has no eval config, so it looks at the engines a config
would most likely have used: each local engine socket (podman rootful and rootless, docker —
the ``TOOLSEAM_PODMAN_URL``, ``TOOLSEAM_PODMAN_ROOTLESS_URL``, ``TOOLSEAM_DOCKER_URL`` or
``DOCKER_HOST`` variables, else the defaults) that exists. An engine on another machine is
cleaned by the sample's own cleanup, or by its engine's ``rm`` filtered on the label.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import shutil
import tempfile
import uuid
from typing import Any

import psutil

from ...backends.owner import still_runs
from ...seam.errors import CouldNotRunError

logger = logging.getLogger(__name__)

SESSION_PREFIX = "inspect-"
WORKSPACE_PREFIX = "toolseam-"
_OWNER_LABEL, _SESSION_LABEL = "toolseam.owner", "toolseam.session"  # containers/sandbox.py


def _local_engines() -> list[Any]:
    """The engines of this machine's sockets that exist; one whose SDK is missing is skipped."""
    engines: list[Any] = []
    podman_urls = {os.environ.get("TOOLSEAM_PODMAN_URL") or "unix:///run/podman/podman.sock"}
    with contextlib.suppress(ImportError):
        from ...backends.podman import PodmanEngine, default_endpoint

        podman_urls.add(os.environ.get("TOOLSEAM_PODMAN_ROOTLESS_URL") or default_endpoint(True))
        engines += [PodmanEngine(url) for url in sorted(podman_urls) if _socket_exists(url)]
    with contextlib.suppress(ImportError):
        from ...backends.docker import docker_engine

        url = (os.environ.get("TOOLSEAM_DOCKER_URL") or os.environ.get("DOCKER_HOST")
               or "unix:///var/run/docker.sock")
        if _socket_exists(url):
            engines.append(docker_engine(url))
    return engines


def _socket_exists(url: str) -> bool:
    return url.startswith("unix://") and os.path.exists(url.removeprefix("unix://"))


def new_session() -> str:
    """A session id that names this process (pid and start time: a pid alone is reused)."""
    me = psutil.Process()
    return f"{SESSION_PREFIX}{me.pid}-{int(me.create_time() * 1000)}-{uuid.uuid4().hex[:8]}"


def _owner_alive(session: str) -> bool:
    """Whether the process that made ``session`` still runs (an id of another form: no)."""
    pid, _, rest = session.removeprefix(SESSION_PREFIX).partition("-")
    started = rest.partition("-")[0]
    if not (pid.isdigit() and started.isdigit()):
        return False
    return still_runs(int(pid), int(started) / 1000)


def _ours(labels: dict[str, str], session: str | None) -> bool:
    name = labels.get(_SESSION_LABEL, "")
    if not name.startswith(SESSION_PREFIX):
        return False
    return name == session if session is not None else not _owner_alive(name)


def _clean_engine(engine: Any, session: str | None) -> int:
    removed = 0
    try:
        for container, labels in engine.labeled(_OWNER_LABEL):
            if _ours(labels, session):
                engine.remove(container)
                removed += 1
        for volume, labels in engine.labeled_volumes(_OWNER_LABEL):
            if _ours(labels, session):
                engine.remove_volume(volume)
    except CouldNotRunError as exc:  # an engine that is down has nothing of ours running
        logger.info("toolseam cleanup: %s", exc.reason)
    finally:
        with contextlib.suppress(Exception):
            engine.close()
    return removed


async def remove_everything(session: str | None) -> int:
    """Remove our containers, volumes and workspaces (only ``session``'s when given);
    returns how many containers went."""
    removed = 0
    for engine in _local_engines():
        removed += await asyncio.to_thread(_clean_engine, engine, session)
    pattern = f"{WORKSPACE_PREFIX}{session or SESSION_PREFIX + '*'}-*"
    for path in glob.glob(os.path.join(tempfile.gettempdir(), pattern)):
        name = os.path.basename(path).removeprefix(WORKSPACE_PREFIX)
        if session is None and _owner_alive(name):
            continue  # a running eval's sample
        shutil.rmtree(path, ignore_errors=True)
    return removed
