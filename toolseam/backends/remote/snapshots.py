"""A snapshot carried between the server's store and the client user's (``Branching`` through a
remote backend, decision 445).

A remote session's snapshot lands in **the client user's store**: ``Snapshot.load``, ``toolseam
snapshots``, ``restore`` and ``fork`` read it there, and a snapshot taken on one server opens a
session on any other. The hosted backend takes and restores snapshots in its own user's store
(the server's: the same one when both ends share this machine's user and staging root), so a
snapshot crosses as its manifest — checked as a stored one is, its id and tree included — and
the objects the receiving store lacks, in pieces of at most ``PIECE`` bytes, each object's
digest checked before it is stored. Nothing crosses when the receiving store has the snapshot
already; what the server's store keeps is its user's (``toolseam snapshots prune`` there).

The server hands out the objects of snapshots the asking session took, nothing else of its
store; what a client pushes is kept only when every byte matches the digest a manifest names.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import IO, Any

from ...seam.errors import CouldNotRunError, HostError
from ..snapshots import DEFAULT_LIMIT, SnapshotCorruptError, SnapshotStore
from ..snapshots.manifest import Manifest, checked_tree
from ..snapshots.store import CHUNK

LACKS, PUT, GET = "snapshot_lacks", "snapshot_put", "snapshot_get"
CARRIER_OPS = frozenset({LACKS, PUT, GET})
PIECE = 16 << 20  # an object's bytes per request or answer: under the codec's request cap
_ID = re.compile(r"[0-9a-f]{20}")

Send = Callable[[str, dict[str, Any]], Awaitable[Any]]


def checked_manifest(text: object) -> Manifest:
    """A manifest from the other end, checked as the store checks its own: its rows, its id
    (it names a file) and its tree (every parent a directory of it, no name twice)."""
    if not isinstance(text, str):
        raise SnapshotCorruptError("a carried manifest is not text")
    manifest = Manifest.loads(text)
    if not _ID.fullmatch(manifest.id):
        raise SnapshotCorruptError(f"a carried manifest's id {manifest.id[:40]!r} is not one")
    checked_tree(manifest.entries)
    return manifest


def file_sizes(manifest: Manifest) -> dict[str, int]:
    """Each object the manifest names, by digest, and its size; past the snapshot limit in
    all, a ``SnapshotCorruptError`` (a manifest is data someone else wrote)."""
    sizes = {e.digest: e.size for e in manifest.entries if e.kind == "file"}
    if sum(sizes.values()) > DEFAULT_LIMIT:
        raise SnapshotCorruptError(f"snapshot {manifest.id} names more than "
                                   f"{DEFAULT_LIMIT >> 30} GiB of files")
    return sizes


class _Object:
    """One object arriving in pieces: spooled, hashed as it comes, stored once whole."""

    def __init__(self, store: SnapshotStore, digest: str, size: int) -> None:
        self.store, self.digest, self.size = store, digest, size
        self.received = 0
        self._hash = hashlib.sha256()
        self._file: IO[bytes] = tempfile.SpooledTemporaryFile(  # noqa: SIM115 - closed in keep
            max_size=PIECE, dir=str(store.root / "tmp"))

    def add(self, offset: object, data: object) -> None:
        if not (isinstance(data, bytes) and offset == self.received
                and self.received + len(data) <= self.size):
            raise SnapshotCorruptError(f"object {self.digest[:12]} arrived out of order or "
                                       "longer than its manifest says")
        self._hash.update(data)
        self._file.write(data)
        self.received += len(data)

    def keep(self) -> None:
        """Into the store, when every byte is there and matches its digest."""
        try:
            if self.received != self.size or self._hash.hexdigest() != self.digest:
                raise SnapshotCorruptError(f"object {self.digest[:12]} does not match its "
                                           "digest (changed on the way)")
            self._file.seek(0)
            self.store.ingest_from(lambda: self._file.read(CHUNK))
        finally:
            self.close()

    def close(self) -> None:
        self._file.close()


# --- the client's side -----------------------------------------------------------------------
async def fetch(send: Send, text: object) -> Manifest:
    """The snapshot the server just took (``text``: its manifest) into this user's store."""
    manifest = checked_manifest(text)
    store = SnapshotStore()
    if store.has_snapshot(manifest.id):  # one store for both ends: nothing to carry
        return store.load(manifest.id)
    with store.lock(exclusive=False):  # what is stored stays until the manifest names it
        for digest, size in file_sizes(manifest).items():
            if store.has(digest):
                continue
            arriving = _Object(store, digest, size)
            try:
                while arriving.received < size:  # an empty file's object: no piece at all
                    piece = await send(GET, {"digest": digest, "offset": arriving.received,
                                             "length": min(PIECE, size - arriving.received)})
                    if not piece:
                        raise SnapshotCorruptError(f"object {digest[:12]} ended early")
                    arriving.add(arriving.received, piece)
            except BaseException:
                arriving.close()
                raise
            arriving.keep()
        store.save(manifest)
    return manifest


async def push(send: Send, snapshot_id: str) -> None:
    """This user's snapshot ``snapshot_id`` into the server's store (``ConfigurationError``:
    there is no such snapshot here), sending only the objects it lacks."""
    store = SnapshotStore()
    manifest = store.load(snapshot_id)
    text, sizes = manifest.dumps(), file_sizes(manifest)
    with store.lock(exclusive=False):
        lacking = await send(LACKS, {"manifest": text})
        for digest in lacking if isinstance(lacking, list) else ():
            if digest not in sizes:
                raise CouldNotRunError(f"the server asked for an object snapshot {snapshot_id} "
                                       "does not name", retryable=False, cause="agent_failed")
            with tempfile.TemporaryFile(dir=store.root / "tmp") as copy:
                store.copy_out(digest, copy.fileno())  # checked against its digest here too
                copy.seek(0)
                offset = 0
                while True:
                    data = copy.read(PIECE)
                    last = offset + len(data) >= sizes[digest]
                    await send(PUT, {"digest": digest, "offset": offset, "data": data,
                                     "last": last})
                    offset += len(data)
                    if last:
                        break
        if lacking and await send(LACKS, {"manifest": text}):
            raise CouldNotRunError(f"snapshot {snapshot_id} did not arrive whole on the server",
                                   retryable=True, cause="agent_failed")


# --- the server's side -----------------------------------------------------------------------
@dataclass
class Arrivals:
    """What one session (or one about to open from a snapshot) is pushing into this store."""

    key: bytes
    owner: object
    wanted: dict[str, int] = field(default_factory=dict)
    arriving: dict[str, _Object] = field(default_factory=dict)

    def lacks(self, text: object) -> list[str]:
        """The objects of the manifest this store lacks; none: the manifest is kept."""
        manifest = checked_manifest(text)
        store = SnapshotStore()
        if store.has_snapshot(manifest.id):
            return []
        sizes = file_sizes(manifest)
        with store.lock(exclusive=False):
            missing = sorted(d for d in sizes if not store.has(d))
            if not missing:
                store.save(manifest)
        self.wanted = {d: sizes[d] for d in missing}
        return missing

    def put(self, digest: object, offset: object, data: object, last: object) -> None:
        if not isinstance(digest, str) or digest not in self.wanted:
            raise HostError("snapshot_put: not an object this session was asked for")
        arriving = self.arriving.get(digest)
        if arriving is None:
            arriving = self.arriving[digest] = _Object(SnapshotStore(), digest,
                                                       self.wanted[digest])
        try:
            arriving.add(offset, data)
            if last is True:
                del self.arriving[digest]
                arriving.keep()
        except BaseException:
            self.arriving.pop(digest, None)
            arriving.close()
            raise

    def close(self) -> None:
        for arriving in self.arriving.values():
            arriving.close()
        self.arriving.clear()


def read_piece(exported: set[str], digest: object, offset: object, length: object) -> bytes:
    """Bytes of an object of a snapshot this session took (``exported``), nothing else."""
    if not (isinstance(digest, str) and digest in exported and isinstance(offset, int)
            and isinstance(length, int) and offset >= 0 and 0 <= length <= PIECE):
        raise HostError("snapshot_get: not a piece of a snapshot this session took")
    return SnapshotStore().read_range(digest, offset, length)
