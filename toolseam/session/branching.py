"""A session's branches (docs/branching.md): ``snapshot``, ``restore``, ``fork`` and ``keep``
for ``Toolkit``, over the backend's ``Branching`` capability (``seam/capabilities.py``) and
the snapshot store (``backends/snapshots/``).

* A session opened from a snapshot without a base dir works in a private directory of its own
  (``new_branch_workspace``), removed when it closes; with a base dir, that directory is made
  the snapshot's tree at open.
* ``fork(n)`` takes a snapshot and opens n sessions of the same backend kind and options from
  it, each in its own private workspace; each child remembers where it came from, and
  ``keep()`` brings its workspace home there by the copy-back rule.
* Processes are never carried: a restore ends the running jobs first and says which.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..backends import backend_kind
from ..backends.snapshots import (
    DEFAULT_LIMIT,
    RestoreResult,
    Snapshot,
    SnapshotStore,
    new_branch_workspace,
    remove_branch_workspace,
)
from ..backends.snapshots.homecoming import baseline_copy, bring_home
from ..seam.capabilities import Branching, branching
from ..seam.errors import ConfigurationError, CouldNotRunError
from ..seam.models import SyncReport
from ..seam.protocol import WorkspaceTransfer
from .toolkit_view import ToolkitView

if TYPE_CHECKING:
    from ..backends.containers.workspace_sync.tar_sync import WorkspaceCopy

MAX_FORK = 64


class Branch(Protocol):
    """A session ``fork`` makes (a ``Toolkit``): it opens and closes, and its own ``Branches``
    learns where it came from before it opens."""

    _branches: Branches

    async def open(self) -> object: ...
    async def close(self) -> object: ...


Child = TypeVar("Child", bound=Branch)


class Branches:
    """One session's part in branching: where it started, where it goes home, what it owns."""

    def __init__(self, snapshot: Snapshot | str | None, options: Mapping[str, Any]) -> None:
        if isinstance(snapshot, str):
            snapshot = Snapshot.load(snapshot)
        if snapshot is not None and not isinstance(snapshot, Snapshot):
            raise ConfigurationError("snapshot must be a toolseam.Snapshot or its id, got "
                                     f"{type(snapshot).__name__}")
        self.start = snapshot
        self.options = dict(options)  # the Toolkit arguments a child gets too
        self.private_workspace: str | None = None
        self.home: str | None = None  # the parent's host dir, for keep()
        self.forked = False  # made by fork(): keep() has a home, unless the parent's is remote
        self.home_stamps: Callable[[], dict[str, tuple[int, int] | None] | None] = \
            lambda: None  # the parent's, for keep(): Branching.home_stamps
        self.filled = False  # the backend's workspace holds the start snapshot already (fork)
        self._home_copy: WorkspaceCopy | None = None

    def placed(self, name: str, base_dir: str | None, options: Mapping[str, Any]
               ) -> tuple[str | None, Mapping[str, Any]]:
        """A session from a snapshot, on a backend named here and without a base dir, gets a
        private workspace (restoring into the current directory would wipe it): the host's
        base dir, or a container's ``/workspace``. The base dir and backend options to use."""
        if self.start is None or base_dir is not None or "workspace" in options:
            return base_dir, options
        contained = backend_kind(name).contained  # an unknown name: refused before any mkdir
        self.private_workspace = new_branch_workspace()
        if contained:  # copy mode unless asked, as a fork's child (decision 401): every
            # engine user can be handed it, a rootless one too, which cannot pass the 0700
            # store a bind mount would need it to (decision 394)
            return None, {"workspace_mode": "copy", **options,
                          "workspace": self.private_workspace}
        return self.private_workspace, options

    async def opened(self, tk: ToolkitView, base: str) -> None:
        """At open: the base dir becomes the start snapshot's tree."""
        if self.start is not None and not self.filled:
            await branching(tk.backend).restore_files(base, self.start.id)

    async def closed(self) -> None:
        if self.private_workspace is not None:
            await asyncio.to_thread(remove_branch_workspace, self.private_workspace)
            self.private_workspace = None

    # --- the public verbs -------------------------------------------------------------------
    async def snapshot(self, tk: ToolkitView, label: str | None, limit: int = DEFAULT_LIMIT
                       ) -> Snapshot:
        await tk.open()
        snap: Snapshot = await branching(tk.backend).snapshot_files(
            tk.base_dir, label, tk.session_id, limit)
        return snap

    async def restore(self, tk: ToolkitView, snapshot: Snapshot | str) -> RestoreResult:
        chosen = snapshot if isinstance(snapshot, Snapshot) else Snapshot.load(snapshot)
        await tk.open()
        capability = branching(tk.backend)
        SnapshotStore().load(chosen.id)  # a wrong id is said before any job is ended
        ended = []
        await tk.services.jobs.refresh()  # jobs that ended on their own are not "ended" here
        for job in tk.services.jobs.running():
            await tk.services.jobs.kill(job)
            ended.append(job.id)
        done = await capability.restore_files(tk.base_dir, chosen.id)
        return RestoreResult(snapshot=chosen.id, ended_jobs=ended, written=done.written,
                             removed=done.removed)

    async def fork(self, tk: ToolkitView, n: int, make: Callable[..., Child]
                   ) -> list[Child | CouldNotRunError]:
        """``n`` children, each ``make(backend, base_dir=..., snapshot=..., session_id=...,
        **options)`` (``Toolkit`` passes its own class: this module is one of its parts)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_FORK:
            raise ConfigurationError(f"fork: n must be an integer from 1 to {MAX_FORK}, got {n!r}")
        snap = await self.snapshot(tk, f"fork of {tk.session_id}")
        capability = branching(tk.backend)
        await capability.ready_branch_home()  # one filled at its first sync (decision 507)
        home = capability.branch_home(tk.base_dir)
        return list(await asyncio.gather(*(self._child(tk, make, capability, snap, home, number)
                                           for number in range(1, n + 1))))

    async def _child(self, tk: ToolkitView, make: Callable[..., Child], capability: Branching,
                     snap: Snapshot, home: str | None, number: int) -> Child | CouldNotRunError:
        child: Child | None = None
        try:
            workspace = new_branch_workspace()
            backend = None
            try:
                backend, base_dir = await asyncio.to_thread(capability.branch_backend,
                                                            workspace, snap.id)
                child = make(backend, base_dir=base_dir, snapshot=snap,
                             session_id=f"{tk.session_id}-{number}", **self.options)
            except BaseException:
                if backend is not None:  # what it holds (a fork's shared base) is let go
                    await asyncio.shield(backend.close())
                remove_branch_workspace(workspace)
                raise
            child._branches.private_workspace = workspace
            child._branches.filled = True
            child._branches.home = home
            child._branches.forked = True
            child._branches.home_stamps = capability.home_stamps
            await child.open()
            return child
        except Exception as exc:  # noqa: BLE001 - this child's failure, in its place
            if child is not None:
                await asyncio.shield(child.close())
            if isinstance(exc, CouldNotRunError):
                return exc
            failed = CouldNotRunError(f"fork: child {number} could not start: {exc}",
                                      retryable=False)
            failed.__cause__ = exc
            return failed

    async def keep(self, tk: ToolkitView) -> SyncReport:
        if self.forked and self.home is None:
            raise ConfigurationError(f"keep: this branch's parent keeps its files on another "
                                     f"machine ({tk.backend.name}); snapshot this branch and "
                                     "restore that snapshot in the parent instead")
        if self.home is None or self.start is None or self.private_workspace is None:
            raise ConfigurationError("keep: only a session made by fork() has a home to bring "
                                     "its workspace to")
        await tk.open()
        if self._home_copy is None:
            self._home_copy = baseline_copy(self.home, SnapshotStore().load(self.start.id),
                                            self.home_stamps())
        # a local fork's overlay child whose private dir was never filled: its workspace's
        # archive straight home (decision 507), not copied to that dir first
        report: SyncReport | None = await branching(tk.backend).keep_directly(self._home_copy)
        if report is not None:
            return report
        if isinstance(tk.backend, WorkspaceTransfer):  # a sandbox's copy to its host dir first
            await tk.backend.sync()
        return await asyncio.to_thread(bring_home, self.private_workspace, self._home_copy)
