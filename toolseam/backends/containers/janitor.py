"""The janitor: what a session leaves behind when its process dies — containers and volumes
whose owner is gone, kept work past its retention, pools' host mounts (``pool.mounts``) and
socket directories no agent listens in. Every session runs one pass per engine as it opens
(sessions opening together share it). Work kept after a failed copy-back stays until the user
removes it (``toolseam recover --remove``) or ``KEPT_RETENTION_S`` has passed."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import socket
import stat
import time
from collections.abc import Awaitable, Callable

from ...seam.errors import CouldNotRunError
from ..snapshots.fork_base import sweep_fork_dirs
from ..staging import user_dir
from .engine.protocol import ContainerState, Engine
from .labels import (
    CLOSING_LABEL,
    DURABLE_LABEL,
    FORK_IMAGE_LABEL,
    KEPT_CONTAINER_LABEL,
    KEPT_LABEL,
    KEPT_RETENTION_S,
    KEPT_VOLUME_LABEL,
    OWNER_LABEL,
    SESSION_LABEL,
    SOCKET_DIR_PREFIX,
    owner_is_gone,
)
from .pool.mounts import sweep_dead_pools

# One janitor pass per engine at a time: sessions opening together share the pass under way
# instead of each listing every container and volume (decision 113).
_JANITORS: dict[str, asyncio.Future[list[str]]] = {}




async def shared_pass(engine: Engine, call: Callable[[Callable[[], list[str]]], Awaitable[list[str]]]
                      ) -> list[str]:
    """One janitor pass on ``engine`` (``call`` runs it in an engine thread), shared with the
    sessions already waiting for one on the same engine and loop."""
    running = _JANITORS.get(engine.endpoint)
    if running is not None and not running.done() and \
            running.get_loop() is asyncio.get_running_loop():
        with contextlib.suppress(Exception):  # a pass whose session went away: run our own
            return await asyncio.shield(running)
    task = asyncio.ensure_future(call(lambda: janitor(engine)))
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    _JANITORS[engine.endpoint] = task
    try:
        return await asyncio.shield(task)
    finally:
        if _JANITORS.get(engine.endpoint) is task and task.done():
            del _JANITORS[engine.endpoint]


def recover_command(engine_name: str, endpoint: str, container: str) -> str:
    """The command line that names this kept container on this engine."""
    backend = "docker" if engine_name.startswith("docker") else "podman"
    rootless = " --rootless" if engine_name == "podman-rootless" else ""
    return (f"toolseam recover --backend {backend}{rootless} --endpoint {shlex.quote(endpoint)} "
            f"{container[:12]}")


def _kept_sessions(engine: Engine, now: float) -> tuple[set[str], list[tuple[str, dict[str, str]]]]:
    """Sessions whose work is kept and within retention; the markers past it."""
    kept, expired = set(), []
    for marker, labels in engine.labeled_volumes(KEPT_LABEL):
        try:
            since = float(labels.get(KEPT_LABEL, ""))
        except ValueError:
            since = 0.0  # unreadable: treated as old
        if now - since > KEPT_RETENTION_S:
            expired.append((marker, labels))
        else:
            kept.add(labels.get(SESSION_LABEL, ""))
    return kept, expired


_ENDED = ("exited", "stopped", "dead")  # not "created": a session may be starting it


def _state(engine: Engine, container: str) -> ContainerState | None:
    try:
        return engine.state(container)
    except CouldNotRunError:
        return None


def _closing(engine: Engine) -> set[str | None]:
    """Sessions a live client is closing (copying its work home from a stopped container)."""
    return {labels.get(SESSION_LABEL) for _, labels in engine.labeled_volumes(OWNER_LABEL)
            if CLOSING_LABEL in labels and not owner_is_gone(labels.get(OWNER_LABEL, ""))}


def janitor(engine: Engine, now: float | None = None) -> list[str]:
    """Remove containers and volumes whose owner process is gone, unless their session's work
    is kept; and kept work past its retention; and the host mounts of pools whose process is
    gone (``pool/mounts.py``), socket directories no agent listens in (``bind``), and the
    overlay dirs and start images of forks whose process is gone (``fork_overlay.py``,
    ``fork_image.py``). Returns the containers
    removed."""
    kept, expired = _kept_sessions(engine, time.time() if now is None else now)
    removed = []
    for marker, labels in expired:
        with contextlib.suppress(CouldNotRunError):
            container = labels.get(KEPT_CONTAINER_LABEL, "")
            if container:
                engine.remove(container)
                removed.append(container)
            if labels.get(KEPT_VOLUME_LABEL):
                engine.remove_volume(labels[KEPT_VOLUME_LABEL])
            engine.remove_volume(marker)
    durable = set()  # sessions that outlive their client, still running: their agents end them
    owned_volumes = engine.labeled_volumes(OWNER_LABEL)  # closing markers among them
    for container, labels in engine.labeled(DURABLE_LABEL):  # no owner: any client may attach
        state = _state(engine, container)
        if state is not None and state.running:
            durable.add(labels.get(SESSION_LABEL))
        elif labels.get(SESSION_LABEL) in _closing(engine):
            # stopped by a live client that is copying its work home from it. Asked after the
            # state: a client marks before it stops, so a container seen stopped has its
            # marker by now (a list made before the state could miss it)
            continue
        elif state is not None and state.status in _ENDED:  # ended itself (its orphan timeout)
            with contextlib.suppress(CouldNotRunError):
                engine.remove(container)
                removed.append(container)
    orphans = 0
    for container, labels in engine.labeled(OWNER_LABEL):
        if labels.get(SESSION_LABEL) not in kept and owner_is_gone(labels.get(OWNER_LABEL, "")):
            orphans += 1
            with contextlib.suppress(CouldNotRunError):
                engine.remove(container)
                removed.append(container)
    for volume, labels in owned_volumes:
        if labels.get(SESSION_LABEL) in durable:  # podman's forced removal takes its container
            continue
        if labels.get(SESSION_LABEL) not in kept and owner_is_gone(labels.get(OWNER_LABEL, "")):
            with contextlib.suppress(CouldNotRunError):
                engine.remove_volume(volume)
    if orphans:  # a fork image lives no longer than the session that forked (its container,
        # the dead owner's too) or its last child: looked for only in a pass that removed
        # one of a dead owner's (the list costs 6-12 ms a session start otherwise)
        for image, labels in engine.labeled_images(FORK_IMAGE_LABEL):
            if owner_is_gone(labels.get(FORK_IMAGE_LABEL, "")):
                with contextlib.suppress(CouldNotRunError):
                    engine.remove_image(image)
    sweep_dead_pools()
    sweep_socket_dirs()
    sweep_fork_dirs()  # after the dead process's containers and volumes: their mounts went
    return removed


_SOCKET_DIR_GRACE_S = 120.0  # a directory this young may belong to a session still starting


def sweep_socket_dirs(now: float | None = None) -> list[str]:
    """Remove the socket directories no agent listens in any more: their session's process
    was killed, or (a session that outlived its client) its agent ended at its orphan timeout
    inside a container the engine then removed. Called by the janitor; returns what went."""
    now = time.time() if now is None else now
    removed = []
    # this user's own socket directories only (staging.user_dir); one a rootless engine's user
    # owns (chowned to it at the start) is taken as ours: its parent is ours alone
    for entry in sorted(user_dir("sockets").iterdir()):
        directory = str(entry)
        try:
            seen = os.lstat(directory)
            if (not stat.S_ISDIR(seen.st_mode) or not entry.name.startswith(SOCKET_DIR_PREFIX)
                    or now - seen.st_mtime < _SOCKET_DIR_GRACE_S
                    or _listening(os.path.join(directory, "agent.sock"))):
                continue
            shutil.rmtree(directory)
        except OSError:
            continue  # gone meanwhile
        removed.append(directory)
    return removed


def _listening(path: str) -> bool:
    if not os.path.exists(path):
        return False
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1)
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()
