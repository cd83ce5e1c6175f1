"""A host fork's children as overlays, where this process may mount (decision 516).

A host fork's child used to be a copy of the snapshot in a private workspace (decision 365):
on this ext4, which has no reflink, ``fork(8)`` of 5 000 files / 200 MiB wrote them 8 times
(8 s). When this process is root the copy is not needed: the snapshot is restored once into
the fork's base (``snapshots/fork_base.py``, the same base the engines' children use, kept
by the session for its next fork) and each child's private workspace is an overlay mounted
over it, in this process's mount namespace, so the host backend's in-process file tools and
the child's agent (whose namespace is made after the mount, a copy of this one) both see it.
A child then costs a mount, whatever the workspace holds.

Where this process is not root the copy stays: an unprivileged overlay exists only inside a
user namespace, which the in-process file tools are not in.

A mount outlives a process that dies without unmounting it: the next fork of any toolseam
process here (and the containers' janitor) sweeps the fork dirs, which detaches the overlays
whose fork dir's process is gone before it removes their dirs (``sweep_fork_dirs``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time
from pathlib import Path

from .mount_calls import mount, unmount
from .snapshots.capture import Known
from .snapshots.fork_base import (
    FORK_BASES,
    BaseHolder,
    ForkBase,
    overlay_paths_plain,
    sweep_fork_dirs,
)
from .snapshots.manifest import Manifest

_SWEEP_EVERY_S = 60.0
_swept = [0.0]
_sweep_lock = threading.Lock()


def overlays_possible(*paths: str) -> bool:
    """Whether a host fork's children can be overlays: this process is root, the kernel has
    overlayfs, and the paths can be written into its mount options."""
    return os.geteuid() == 0 and overlay_paths_plain(*paths) and _kernel_has_overlay()


@functools.cache  # asked for each child of each fork; the kernel's answer does not change
def _kernel_has_overlay() -> bool:
    try:
        return "\toverlay\n" in Path("/proc/filesystems").read_text()
    except OSError:
        return False


class HostOverlay:
    """One child's private workspace: an overlay over its fork's base, mounted there."""

    def __init__(self, base: ForkBase, workspace: str) -> None:
        self.base: ForkBase | None = base
        self.workspace = workspace
        self._dir: str | None = None

    @classmethod
    def mount(cls, holder: BaseHolder | None, manifest: Manifest, workspace: str) -> HostOverlay:
        """The overlay of ``manifest`` at ``workspace`` (an empty dir ``new_branch_workspace``
        made). ``holder``: the session that forked, which keeps the base for its next fork."""
        _sweep_now_and_then()
        made = cls(FORK_BASES.acquire(holder, manifest, None, rootless=False), workspace)
        try:
            made._mount()
        except BaseException:
            made.unmount()
            raise
        return made

    def _mount(self) -> None:
        assert self.base is not None
        self.base.ready.wait()
        if self.base.failure is not None:
            raise self.base.failure
        # 0700, as a copied private workspace's root: only this user enters a branch
        self._dir, upper, work = self.base.child_dirs(root_mode=0o700)
        options = f"lowerdir={self.base.base},upperdir={upper},workdir={work}"
        mount("overlay", self.workspace, 0, "overlay", options)

    def known(self) -> Known:
        """What the base's restore knew of its files, for the child's first snapshot: an
        overlay shows a file it has not copied up with the base's inode and times."""
        assert self.base is not None
        return self.base.known()

    def unmount(self) -> None:
        """After the child's agent stopped: the mount detached, the child's dirs removed, its
        hold on the base let go (the last one removes the base unless the session keeps it)."""
        base, self.base = self.base, None
        if base is None:
            return
        try:
            unmount(self.workspace)  # not mounted (the mount itself failed) is no failure
            if self._dir is not None:
                with contextlib.suppress(OSError):
                    base.remove_child(self._dir)
        finally:
            FORK_BASES.release(base)


def _sweep_now_and_then() -> None:
    with _sweep_lock:
        if time.monotonic() - _swept[0] < _SWEEP_EVERY_S and _swept[0]:
            return
        _swept[0] = time.monotonic()
    sweep_fork_dirs()
