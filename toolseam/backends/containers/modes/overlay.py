"""A fork's child on an engine of this machine (decision 507): copy mode in every respect —
the channel, snapshots and restores packed and applied by the sandbox's root, uploads through
the archive API, ``sync`` and ``keep()`` copying the workspace to the child's private host
directory — except where ``/workspace`` comes from. Its volume is an overlay over the fork's
shared base (``fork_overlay.py``) instead of a copy of the base dir pushed through the archive
API: nothing is copied in, so the child's start does not grow with the workspace.

The child's private host directory starts empty, with an empty baseline: its first ``sync``
(``keep()``'s) brings the whole workspace there, later ones what changed. Its close brings
nothing home: a fork's private directory is removed when it closes (``session/branching.py``),
and an engine unmounts the overlay once the container stopped (podman's archive API then reads
an empty directory). After the container and the volume went, the child's upper and work dirs
are removed and its hold on the base released.
"""

from __future__ import annotations

import asyncio
import contextlib

from ..engine.protocol import in_engine_thread
from ..fork_overlay import FORK_BASES, ForkBase
from ..options import SetidFiles
from ..sandbox import ContainerSandbox
from ..workspace_sync.tar_sync import WorkspaceCopy
from .copy import CopyMode


class OverlayMode(CopyMode):
    def __init__(self, base: ForkBase, copy_limit: int, keep_group_write: bool,
                 setid_files: SetidFiles = None) -> None:
        super().__init__(copy_limit, keep_group_write, setid_files)
        self.fork_base: ForkBase | None = base
        self.child_dir: str | None = None  # its name below the fork's dir, once made

    def _create_workspace_volume(self, sandbox: ContainerSandbox, volume: str,
                                 labels: dict[str, str]) -> None:
        assert self.fork_base is not None
        self.child_dir, upper, work = self.fork_base.child_dirs()
        sandbox.engine.create_volume(volume, labels, self.fork_base.volume_options(upper, work))

    def _fill(self, sandbox: ContainerSandbox) -> None:
        self.copy = WorkspaceCopy(sandbox.workspace, self._copy_limit,
                                  keep_group_write=self._keep_group_write)
        self._copy_changed = True

    async def finish(self, sandbox: ContainerSandbox) -> None:
        """Nothing comes home at close: the private directory goes with the child."""

    async def clean_up(self, sandbox: ContainerSandbox) -> None:
        await super().clean_up(sandbox)  # the volume (its mount went with the container)
        base, self.fork_base = self.fork_base, None
        if base is None:
            return
        child, self.child_dir = self.child_dir, None

        def remove() -> None:
            try:
                if child is not None:
                    with contextlib.suppress(OSError):
                        base.remove_child(child)
            finally:
                FORK_BASES.release(base)
        await asyncio.shield(in_engine_thread(remove))
