"""A fork's start image (decision 512): where the parent wrote outside its workspace (a
writable root: packages, ``/opt``, ``/etc``), the fork's children start from ONE image made
for the fork, instead of each child being sent the parent's whole layer when it opens (8
children x 100 MiB through the archive API took 11.7-20.5 s).

* **Made** from the snapshot, not from the running parent (whose files go on changing, and
  whose commit the engines pause for): a never-started container of the session's image is
  given the snapshot's layer outside ``/tmp`` through the archive API — each object checked
  against its digest as it is copied out of the store, links as links, set-id bits already
  dropped at capture; the engine writes the tar inside that container's own root — and
  committed (never paused: it never ran). ``/tmp`` is a tmpfs a commit does not see; the
  child's open writes it as before.
* **Names**: a child's engine diff is against that image, not the session's. The names the
  parent's layer had at the snapshot (``LayerNames``, relative to the session's image) are
  kept with the child, and every diff of the child is read through ``on_fork_image``, so its
  snapshots, restores and forks still name the layer against the session's image — the
  snapshot's format and every reader stay as they are.
* **Only** when that is exact: the parent deleted none of the image's names (a tar cannot
  carry a deletion), and its names at the snapshot are known to this process (the fork's
  own snapshot). Otherwise each child opens with the layer written into it (decision 440).
* **Gone** with the fork's base (``ForkBases.release``: after the last child's container),
  never forced (podman's force removes the containers using an image); a process that died
  leaves it to the janitor (``FORK_IMAGE_LABEL``: the owner's pid and start time).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import secrets
import tarfile
import tempfile
import threading
from typing import IO

from ..snapshots.manifest import Manifest, checked_tree
from ..snapshots.store import SnapshotStore
from .engine.errors import EngineError
from .engine.protocol import ContainerSpec, Engine, Hardening
from .labels import AGENT_MOUNT, FORK_IMAGE_LABEL, OWNER_LABEL, owner_label
from .layer import WHOLE, LayerNames, below
from .layer_restore import in_order, layer_member


def fork_image_fits(manifest: Manifest, names: LayerNames | None) -> bool:
    """Whether a fork of ``manifest`` starts its children from an image: its layer holds
    something outside ``/tmp``, nothing of the image was deleted, and its names are known."""
    return (names is not None and not names.deleted and not manifest.layer_deleted
            and any(not below(e.path, WHOLE) for e in manifest.layer))


def layer_key(manifest: Manifest) -> str:
    """What a start image holds of a snapshot, as one digest: its layer outside ``/tmp``
    (names, kinds, modes, times, contents). Two snapshots with the same key (and image) have
    the same start image: a session's next fork keeps it (decision 513)."""
    entries = sorted((e.path, e.kind, e.mode, e.mtime_ns, e.digest) for e in manifest.layer
                     if not below(e.path, WHOLE))
    return hashlib.sha256(json.dumps(entries).encode("utf-8", "surrogateescape")).hexdigest()


def tmp_part(manifest: Manifest) -> Manifest:
    """The snapshot's layer a child on the fork's image still gets at its open: ``/tmp``."""
    return dataclasses.replace(manifest, layer=[e for e in manifest.layer
                                                if below(e.path, WHOLE)], layer_deleted=[])


def on_fork_image(base: LayerNames, now: LayerNames) -> LayerNames:
    """A child's engine diff ``now`` (against the fork's image) as a diff against the session's
    image, the fork's image being that image plus ``base`` (which deleted nothing). What the
    child did below a directory the parent added is in that directory, taken whole."""
    def under_added(name: str) -> bool:
        return below(name, base.added)
    added = [top for top in base.added if not below(top, now.deleted)]
    added += [top for top in now.added if not under_added(top)]
    changed = {n for n in base.changed if not below(n, now.deleted)}
    changed |= {n for n in now.changed if not under_added(n)}
    deleted = [n for n in now.deleted if not under_added(n)]
    return LayerNames(sorted(added), sorted(changed), deleted)


class ForkImage:
    """One fork's start image on one engine: made in a thread of its own while the fork's
    base is restored; each child waits for it just before its container is made."""

    def __init__(self, engine: Engine, image: str, hardening: Hardening, manifest: Manifest,
                 names: LayerNames) -> None:
        self.engine, self.image, self.hardening = engine, image, hardening
        self.manifest, self.names = manifest, names  # the fork's snapshot, read once
        self.id: str | None = None
        self.failure: BaseException | None = None
        self.ready = threading.Event()

    def start(self) -> ForkImage:
        threading.Thread(target=self._make, daemon=True, name="toolseam-fork-image").start()
        return self

    def wait(self) -> str:
        """The image's id, or the failure to make it raised (each child's)."""
        self.ready.wait()
        if self.failure is not None:
            raise self.failure
        assert self.id is not None
        return self.id

    def _make(self) -> None:
        try:
            manifest = self.manifest
            helper = self.engine.create(ContainerSpec(
                image=self.image, name=f"toolseam-fork-image-{secrets.token_hex(6)}",
                command=[f"{AGENT_MOUNT}/never-started"], labels={OWNER_LABEL: owner_label()},
                environment={}, binds=[], hardening=self.hardening))
            try:
                with tempfile.TemporaryFile(prefix="toolseam-fork-image-") as archive:
                    _layer_tar(manifest, archive)
                    archive.seek(0)
                    self.engine.put_archive(helper, "/", archive)
                self.id = self.engine.commit(helper, (FORK_IMAGE_LABEL, owner_label()))
            finally:
                self.engine.remove(helper)
        except BaseException as exc:  # noqa: BLE001 - each child's start raises it
            self.failure = exc
        finally:
            self.ready.set()

    def remove(self) -> None:
        """After the last child's container went: the image, then this engine's client."""
        self.ready.wait()
        try:
            # still used (a container the janitor has yet to take): the janitor's turn
            if self.id is not None:
                with contextlib.suppress(EngineError):
                    self.engine.remove_image(self.id)
        finally:
            self.engine.close()


def _layer_tar(manifest: Manifest, out: IO[bytes]) -> None:
    """The snapshot's layer outside ``/tmp`` as a tar the engine applies at ``/`` (parents
    first; every object checked against its digest as it is copied out)."""
    store = SnapshotStore()
    tree = checked_tree(manifest.layer)
    with store.lock(exclusive=False), tarfile.open(fileobj=out, mode="w",
                                                   format=tarfile.PAX_FORMAT) as tar:
        for entry in in_order(e for e in tree.values() if not below(e.path, WHOLE)):
            layer_member(entry, store, tar, prefix="")

