"""``toolseam.Snapshot``: a session's files at one moment, kept in this user's store
(``store.py``) until removed — closing or deleting a session never deletes its snapshots."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .manifest import Manifest
from .store import SnapshotStore

NOT_CARRIED = ("running processes, terminals and exposed ports are not part of a snapshot "
               "(process checkpointing, CRIU, does not work on this kernel): only files are")


class Snapshot(BaseModel):
    """A snapshot's public facts; its files are in the store, named by ``id``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="20 hex digits: what Snapshot.load and the CLI take")
    label: str | None = Field(description="the caller's name for it, if any")
    created: datetime = Field(description="when it was taken (UTC)")
    size_bytes: int = Field(description="what it added to the store (files it shares with "
                            "earlier snapshots are stored once)")
    backend: str = Field(description="the kind of backend it was taken on")
    session: str = Field(description="the session it was taken of")
    files: int = Field(description="how many names (files, directories, links) it holds")
    left_out: list[str] = Field(description="names not kept: fifos, sockets, device nodes")
    outside_workspace: int = Field(
        default=0, description="names of a container's writable layer kept beside the "
        "workspace (/tmp, packages a command installed; docs/branching.md)")
    deleted_outside: list[str] = Field(
        default_factory=list, description="files of a container's image a command had "
        "deleted (a restore deletes them again), relative to /")
    processes: Literal["not carried"] = Field(
        default="not carried", description=NOT_CARRIED)

    @classmethod
    def load(cls, snapshot_id: str) -> Snapshot:
        """The snapshot ``snapshot_id`` names in this user's store, from any process
        (``ConfigurationError`` when there is none)."""
        return cls.of(SnapshotStore().load(snapshot_id))

    @classmethod
    def all(cls) -> list[Snapshot]:
        """Every snapshot in this user's store, oldest first (``toolseam snapshots list``)."""
        return [cls.of(manifest) for manifest in SnapshotStore().all()]

    def delete(self) -> None:
        """Remove this snapshot, and the stored files no other snapshot names."""
        SnapshotStore().remove([self.id])

    @classmethod
    def of(cls, manifest: Manifest) -> Snapshot:
        return cls(id=manifest.id, label=manifest.label,
                   created=datetime.fromtimestamp(manifest.created, UTC),
                   size_bytes=manifest.size_bytes, backend=manifest.backend,
                   session=manifest.session, files=len(manifest.entries),
                   left_out=manifest.left_out, outside_workspace=len(manifest.layer),
                   deleted_outside=manifest.layer_deleted)


class RestoreResult(BaseModel):
    """What ``Toolkit.restore`` did."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    snapshot: str = Field(description="the snapshot's id")
    ended_jobs: list[int] = Field(description="jobs that were still running and were ended "
                                  "first (their processes are not part of the snapshot)")
    written: int = Field(description="files written (the others held the snapshot's bytes)")
    removed: int = Field(description="names removed (not in the snapshot)")
    processes: Literal["not carried"] = Field(default="not carried", description=NOT_CARRIED)
