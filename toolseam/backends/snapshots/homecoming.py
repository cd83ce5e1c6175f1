"""``keep()``: a branch's workspace brought home to the directory it was forked from, by the
copy-back rule every container's workspace comes home by (``containers/workspace_sync/``):
all or nothing, a path both sides changed keeps the home's version with the branch's beside
it, every rule of the host boundary. The baseline is the snapshot the branch started from,
so what the home changed since the fork is known as the home's own."""

from __future__ import annotations

import tempfile
from typing import IO

from ...seam.models import SyncReport
from ..containers.workspace_sync.policy import Entry as CopyEntry
from ..containers.workspace_sync.policy import policy_mode
from ..containers.workspace_sync.tar_sync import WorkspaceCopy
from .manifest import Manifest
from .tree_tar import pack_tree


def baseline_copy(home: str, start: Manifest,
                  stamps: dict[str, tuple[int, int] | None] | None = None) -> WorkspaceCopy:
    """A copy-back of ``home`` whose baseline is the snapshot a branch started from.
    ``stamps``: the home's own (size, mtime) of each name when it was last in step with the
    session, where the home is a copy of the session's files (copy mode); None: the
    snapshot's (the home is the session's files)."""
    copy = WorkspaceCopy(home)
    for entry in start.entries:
        stamp = (entry.size, entry.mtime_ns) if stamps is None else stamps.get(entry.path)
        if entry.kind == "file":
            copy.baseline[entry.path] = CopyEntry("file", policy_mode(entry.mode), entry.digest,
                                                  entry.size, stamp)
        elif entry.kind == "dir":
            copy.baseline[entry.path] = CopyEntry("dir", policy_mode(entry.mode), "",
                                                  host_stamp=stamp)
        else:
            copy.baseline[entry.path] = CopyEntry("link", 0, entry.digest, host_stamp=stamp)
    return copy


def bring_home(branch_root: str, copy: WorkspaceCopy) -> SyncReport:
    """The branch's tree as the archive a copy-back reads, applied to the copy's home."""
    with tempfile.TemporaryFile(prefix="toolseam-keep-") as archive:
        _pack(branch_root, archive)
        archive.seek(0)
        return copy.apply(archive, source=f"the branch's workspace {branch_root}")


def _pack(root: str, out: IO[bytes]) -> None:
    """The branch's workspace as a copy-back reads it: the workspace first, below it every
    name of the tree (a command of the branch may still run: read below descriptors)."""
    pack_tree(root, "workspace", out)
