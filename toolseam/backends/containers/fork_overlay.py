"""A fork's children on a local engine (decision 507): each child's ``/workspace`` is an
overlay over the fork's base (``snapshots/fork_base.py``) with an upper and a work directory of
its own — a volume of the engine's ``local`` driver whose mount is ``type=overlay`` (docker,
rootful and rootless podman alike), mounted by the engine when the child's container starts
and unmounted when it goes. The janitor removes a dead process's containers and volumes (their
mounts) before its fork dirs (``sweep_fork_dirs``)."""

from __future__ import annotations

import contextlib

from ..snapshots.fork_base import FORK_BASES, ForkBase
from .engine.protocol import Engine
from .fork_image import ForkImage


def volume_options(base: ForkBase, upper: str, work: str) -> dict[str, str]:
    """The ``local`` driver's options for a child's overlay."""
    extra = ",userxattr" if base.userxattr else ""
    return {"type": "overlay", "device": "overlay",
            "o": f"lowerdir={base.base},upperdir={upper},workdir={work}{extra}"}


class ChildOverlay:
    """One child's overlay (a copy-mode sandbox's ``overlay``, ``modes/copy.py``): its upper and
    work dirs, made with its volume, and its hold on the fork's base, let go once."""

    def __init__(self, base: ForkBase, image: ForkImage | None = None) -> None:
        self.base: ForkBase | None = base
        self.dir: str | None = None  # its name below the fork's dir, once made
        self.image = image  # the fork's start image, when the parent wrote outside /workspace

    def create_volume(self, engine: Engine, volume: str, labels: dict[str, str]) -> None:
        assert self.base is not None
        self.dir, upper, work = self.base.child_dirs()
        engine.create_volume(volume, labels, volume_options(self.base, upper, work))

    def wait(self) -> None:
        """Before the container starts (the engine mounts the overlay then): the base filled,
        or the restore's failure raised."""
        assert self.base is not None
        self.base.ready.wait()
        if self.base.failure is not None:
            raise self.base.failure

    def release(self) -> None:
        """After the child's container and volume went (the mount with them): its dirs, and
        its hold on the base (the last hold removes the base)."""
        base, self.base = self.base, None
        if base is None:
            return
        child, self.dir = self.dir, None
        try:
            if child is not None:
                with contextlib.suppress(OSError):
                    base.remove_child(child)
        finally:
            FORK_BASES.release(base)
