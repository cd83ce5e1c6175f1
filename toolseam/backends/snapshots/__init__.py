"""Snapshots of a session's files: the store (``store.py``), what a snapshot holds
(``manifest.py``), taking one (``capture.py``) and restoring one (``apply.py``) on this
machine, and the public ``Snapshot`` (``snapshot.py``). docs/branching.md."""

from .apply import Restored
from .local import (
    DEFAULT_LIMIT,
    LocalSnapshots,
    filled_branch_workspace,
    new_branch_workspace,
    remove_branch_workspace,
    restore_tree,
)
from .manifest import SnapshotCorruptError
from .snapshot import RestoreResult, Snapshot
from .store import SnapshotStore

__all__ = ["DEFAULT_LIMIT", "LocalSnapshots", "RestoreResult", "Restored", "Snapshot",
           "SnapshotCorruptError", "SnapshotStore", "filled_branch_workspace",
           "new_branch_workspace", "remove_branch_workspace", "restore_tree"]
