"""A snapshot pool's warm workspaces (``SandboxPool(..., snapshot=snap)``, docs/pool.md): private
directories of this user's snapshot store, each made the snapshot's tree by the safe restore
(``backends/snapshots/apply.py``) before a hand-out asks, so a hand-out mounts (bind mode) or
copies (copy mode) a tree that is ready.

Each workspace serves one hand-out and is removed when that session closes (decision 435: a
returned sandbox and its workspace are discarded, never reset and handed out again), so no
session ever sees another's changes. Filling runs one workspace at a time in a thread, in the
background; a failure (the snapshot removed meanwhile, a tampered object) stops the
background filling and is raised by the next hand-out, which tries again itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from ..backends.snapshots import (
    Snapshot,
    filled_branch_workspace,
    remove_branch_workspace,
    restore_tree,
)
from ..seam.errors import ConfigurationError

__all__ = ["WarmWorkspaces", "checked_snapshot"]


def checked_snapshot(snapshot: Snapshot | str) -> Snapshot:
    """The snapshot, read again from this user's store: a wrong id, or a snapshot since
    removed, is a ``ConfigurationError`` naming it before anything starts."""
    if isinstance(snapshot, Snapshot):
        snapshot_id = snapshot.id
    elif isinstance(snapshot, str):
        snapshot_id = snapshot
    else:
        raise ConfigurationError("SandboxPool: snapshot must be a toolseam.Snapshot or its id, "
                                 f"got {type(snapshot).__name__}")
    try:
        return Snapshot.load(snapshot_id)
    except ConfigurationError as exc:
        raise ConfigurationError(f"SandboxPool: snapshot {snapshot_id!r} cannot be used: "
                                 f"{exc}") from None


class WarmWorkspaces:
    """Up to ``target`` private workspaces holding ``snapshot``'s tree, refilled after each
    hand-out when ``refill``; ``owner``: the uid their files are given to (a rootless engine's
    user, when this process is root and binds), None for this process's."""

    def __init__(self, snapshot: Snapshot, target: int, refill: bool, owner: int | None
                 ) -> None:
        self.snapshot = snapshot
        self.target = target
        self.refill = refill
        self.owner = owner
        self._ready: deque[str] = deque()
        self._filler: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._closed = False

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    def start(self) -> None:
        """Fill up to ``target`` in the background (idempotent while it runs)."""
        if self._closed or self._failure is not None:
            return
        if self._filler is None or self._filler.done():
            self._filler = asyncio.ensure_future(self._fill())

    async def wait_full(self) -> None:
        """Until ``target`` are ready (without refill: the first fill); raises the failure
        that stopped the filling, if one did."""
        self._failure = None  # like the pool's wait_full: it tries again after a failure
        self.start()
        if self._filler is not None:
            await asyncio.shield(self._filler)
        if self._failure is not None:
            raise self._failure

    async def _fill(self) -> None:
        while not self._closed and len(self._ready) < self.target:
            try:
                path = await asyncio.to_thread(filled_branch_workspace, self.snapshot.id,
                                               self.owner)
            except Exception as exc:  # noqa: BLE001 - raised by the next hand-out instead
                self._failure = exc
                return
            if self._closed:  # the pool closed while this one was filled
                await asyncio.to_thread(remove_branch_workspace, path)
                return
            self._ready.append(path)

    async def take(self) -> str:
        """A workspace holding the snapshot's tree, for one hand-out: the caller removes it
        (``remove``) when its session ends, or at once if the hand-out fails."""
        self._failure = None  # a new request tries again after a failure
        path = self._ready.popleft() if self._ready else await asyncio.to_thread(
            filled_branch_workspace, self.snapshot.id, self.owner)
        if self.refill:
            self.start()
        return path

    async def restore_into(self, base_dir: str) -> None:
        """A hand-out's own base dir made the snapshot's tree (as ``Toolkit(backend,
        base_dir=..., snapshot=...)`` does at open)."""
        await asyncio.to_thread(restore_tree, base_dir, self.snapshot.id, self.owner)

    @staticmethod
    async def remove(path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            await asyncio.to_thread(remove_branch_workspace, path)

    async def close(self) -> None:
        """Remove every workspace not handed out; one being filled is waited for (a thread
        cannot be cancelled) and removed."""
        self._closed = True
        if self._filler is not None:
            with contextlib.suppress(Exception):
                await self._filler
        while self._ready:
            await self.remove(self._ready.popleft())
