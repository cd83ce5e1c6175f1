"""The snapshot store: this user's, content-addressed, in the staging root (``staging.py``).

``<staging root>/snapshots/`` (0700) holds ``objects/<2 hex>/<sha256>`` — each file's bytes
once, however many snapshots name them (0600) — and ``manifests/<id>.json`` (0600), one per
snapshot. Every object read back is hashed as it is copied out and refused when its bytes do
not match its name (``SnapshotCorruptError``): a tampered entry never reaches a session. Every
file and directory is opened without following links and must be this user's, unreadable to
others; another user's store is never looked at (each user has their own staging root).

Taking a snapshot holds the store's lock shared from its first object to its manifest;
removing one holds it exclusive while it deletes the objects no manifest names any more, so
a snapshot being taken in another process never loses an object it has just stored.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import stat
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

from ...seam.errors import ConfigurationError
from ..staging import UnsafePath, check_ancestors, check_owned, staging_root
from .manifest import SHA256, Manifest, SnapshotCorruptError

CHUNK = 1 << 20
# Objects whose bytes this process has hashed, by (digest) -> their (inode, size, mtime, ctime)
# then: an object with the same stat since is copied without hashing it again (any write or
# chmod moves its ctime, which no one can set back), so a fork's n children hash each object
# once, and a restore right after a snapshot not at all.
_verified: dict[str, tuple[int, int, int, int]] = {}


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns
_ID = re.compile(r"[0-9a-f]{20}")
# manifests this process wrote or read and checked, by the digest of their bytes
# (``SnapshotStore.load``): a fork's children and a session's restores read the same few
_LOADED: OrderedDict[tuple[str, str, bytes], Manifest] = OrderedDict()
_LOADED_MAX, _LOADED_MAX_ENTRIES = 16, 100_000  # ≈ 40 MB of entries at most (the newest kept)
_LOADED_LOCK = threading.Lock()


def store_root() -> Path:
    """``$TOOLSEAM_SNAPSHOTS`` when set (a directory this user owns: a bigger disk, a test's
    own), else ``<staging root>/snapshots``."""
    chosen = os.environ.get("TOOLSEAM_SNAPSHOTS")
    return Path(os.path.abspath(chosen)) if chosen else staging_root() / "snapshots"


def _text_key(root: Path, snapshot_id: str, text: bytes) -> tuple[str, str, bytes]:
    return (str(root), snapshot_id, hashlib.sha256(text).digest())


def _remember(key: tuple[str, str, bytes], manifest: Manifest) -> None:
    with _LOADED_LOCK:
        _LOADED[key] = manifest
        while len(_LOADED) > 1 and (len(_LOADED) > _LOADED_MAX or sum(
                len(m.entries) + len(m.layer) for m in _LOADED.values()) > _LOADED_MAX_ENTRIES):
            _LOADED.popitem(last=False)


class SnapshotStore:
    """One user's store (``root``: default ``store_root()``, made if missing); ``branches/``
    beside it holds the private workspaces of sessions opened from a snapshot."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or store_root()
        self._objects = str(self.root / "objects")
        uid = os.geteuid()
        try:
            if self.root.parent != staging_root():
                check_ancestors(self.root, uid)
            for path in (self.root, self.root / "objects", self.root / "manifests",
                         self.root / "tmp", self.root / "branches"):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(path, 0o700)
                check_owned(path, uid, exact_owner=True)
                if stat.S_IMODE(os.lstat(path).st_mode) != 0o700:
                    os.chmod(path, 0o700)
        except (UnsafePath, OSError) as exc:
            raise ConfigurationError(f"snapshot store {self.root}: {exc} — it must be this "
                                     "user's alone") from None

    # --- objects --------------------------------------------------------------------------
    def _object(self, digest: str) -> str:
        return f"{self._objects}/{digest[:2]}/{digest}"  # a str: pathlib costs ~5x here

    def has(self, digest: str) -> bool:
        return os.path.lexists(self._object(digest))

    def has_snapshot(self, snapshot_id: str) -> bool:
        return bool(_ID.fullmatch(snapshot_id)) and os.path.lexists(
            self.root / "manifests" / f"{snapshot_id}.json")

    def ingest(self, source_fd: int) -> tuple[str, int]:
        """The bytes readable from ``source_fd`` into the store; their digest and how many
        bytes the store grew by (0 when it had them already)."""
        return self.ingest_from(lambda: os.read(source_fd, CHUNK))

    def ingest_from(self, read: Callable[[], bytes]) -> tuple[str, int]:
        """``ingest`` of what ``read`` returns until it returns nothing (a member of an engine's
        archive, say)."""
        digest = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
        try:
            size = 0
            while chunk := read():
                digest.update(chunk)
                os.write(fd, chunk)  # a regular file takes all of it (or raises)
                size += len(chunk)
            os.close(fd)
            fd = -1
            name = digest.hexdigest()
            target = self._object(name)
            with contextlib.suppress(FileExistsError):
                os.mkdir(os.path.dirname(target), 0o700)
            try:
                os.link(tmp, target)
            except FileExistsError:
                return name, 0
            os.unlink(tmp)  # before the stat below: a link count change moves the ctime
            tmp = ""
            _verified[name] = _identity(os.lstat(target))  # hashed as it was written
            return name, size
        finally:
            if fd >= 0:
                os.close(fd)
            if tmp:
                os.unlink(tmp)

    def copy_out(self, digest: str, target_fd: int) -> None:
        """The object's bytes to ``target_fd``, checked against ``digest`` as they go
        (``SnapshotCorruptError`` on any mismatch, or an object that is not this user's)."""
        with self._own_object(digest) as (fd, st):
            if _verified.get(digest) == _identity(st):
                _copy_range(fd, target_fd, st.st_size)
                return
            hashing = hashlib.sha256()
            while chunk := os.read(fd, CHUNK):
                hashing.update(chunk)
                os.write(target_fd, chunk)
            if hashing.hexdigest() != digest:
                raise SnapshotCorruptError(f"object {digest[:12]} does not match its digest "
                                           "(changed after it was stored)")
            _verified[digest] = _identity(st)

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """At most ``length`` bytes of the object from ``offset`` — for a carrier whose other
        end checks the whole digest (``remote/snapshots.py``); an object that is not this
        user's alone is refused as ``copy_out`` refuses it."""
        with self._own_object(digest) as (fd, _st):
            return os.pread(fd, length, offset)

    @contextlib.contextmanager
    def _own_object(self, digest: str) -> Iterator[tuple[int, os.stat_result]]:
        """The object ``digest`` names, open for reading, with its stat — refused
        (``SnapshotCorruptError``) unless it is a regular file this user's alone."""
        if not SHA256.fullmatch(digest):
            raise SnapshotCorruptError(f"{digest!r} is not a sha256 digest")
        try:
            fd = os.open(self._object(digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise SnapshotCorruptError(f"object {digest[:12]} is missing ({exc.strerror})") from None
        try:
            st = os.fstat(fd)
            if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid()
                    or st.st_mode & 0o077):
                raise SnapshotCorruptError(f"object {digest[:12]} is not this user's alone")
            yield fd, st
        finally:
            os.close(fd)

    # --- manifests ------------------------------------------------------------------------
    def save(self, manifest: Manifest) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
        text = manifest.dumps().encode("ascii")
        with os.fdopen(fd, "wb") as out:
            out.write(text)
        os.rename(tmp, self.root / "manifests" / f"{manifest.id}.json")
        _remember(_text_key(self.root, manifest.id, text), manifest)  # a restore's first read

    def load(self, snapshot_id: str) -> Manifest:
        """The manifest ``snapshot_id`` names (``ConfigurationError``: no such snapshot).
        Read-only: the same object is handed to every caller while its bytes are unchanged."""
        if not isinstance(snapshot_id, str) or not _ID.fullmatch(snapshot_id):
            raise ConfigurationError(f"snapshot id {snapshot_id!r} is not one (20 hex digits)")
        try:
            fd = os.open(self.root / "manifests" / f"{snapshot_id}.json",
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ConfigurationError(f"no snapshot {snapshot_id} in {self.root}") from None
        with os.fdopen(fd, "rb") as source:
            st = os.fstat(source.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise SnapshotCorruptError(f"the manifest of {snapshot_id} is not this user's alone")
            text = source.read()
        # A restore read the same manifest three times (the session's check, the backend's,
        # a Snapshot by id), and a fork once per child: 5 000 entries checked each time,
        # ≈ 40 ms. The checked manifest is kept by the digest of its bytes, so a manifest
        # changed in any way is read and checked again; hashing them costs under 1 ms.
        same_text = _text_key(self.root, snapshot_id, text)
        with _LOADED_LOCK:
            if same_text in _LOADED:
                _LOADED.move_to_end(same_text)
                return _LOADED[same_text]
        manifest = Manifest.loads(text.decode("ascii", "replace"))
        if manifest.id != snapshot_id:
            raise SnapshotCorruptError(f"the manifest of {snapshot_id} names {manifest.id}")
        _remember(same_text, manifest)
        return manifest

    def ids(self) -> list[str]:
        return sorted(p.stem for p in (self.root / "manifests").glob("*.json")
                      if _ID.fullmatch(p.stem))

    def all(self) -> list[Manifest]:
        """Every snapshot this store holds, oldest first (unreadable ones left out)."""
        found = []
        for snapshot_id in self.ids():
            with contextlib.suppress(SnapshotCorruptError, ConfigurationError, OSError):
                found.append(self.load(snapshot_id))
        return sorted(found, key=lambda m: m.created)

    # --- removal ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, exclusive: bool) -> Iterator[None]:
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    def remove(self, snapshot_ids: list[str]) -> int:
        """Delete these snapshots and every object no other snapshot names; bytes freed."""
        for snapshot_id in snapshot_ids:
            self.load(snapshot_id)  # a clear error for a wrong id, before anything goes
        with self.lock(exclusive=True):
            for snapshot_id in snapshot_ids:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.root / "manifests" / f"{snapshot_id}.json")
            return self._collect()

    def prune(self, older_than_s: float) -> list[str]:
        """Delete the snapshots made more than ``older_than_s`` ago; their ids."""
        cutoff = time.time() - older_than_s
        old = [m.id for m in self.all() if m.created < cutoff]
        self.remove(old)
        return old

    def _collect(self) -> int:
        named: set[str] = set()
        for snapshot_id in self.ids():
            try:
                manifest = self.load(snapshot_id)
            except (SnapshotCorruptError, ConfigurationError):
                continue  # its objects go too: it can never be restored
            named.update(manifest.digests())
        freed = 0
        for shard in (self.root / "objects").iterdir():
            for item in shard.iterdir():
                if item.name not in named:
                    freed += item.lstat().st_size
                    item.unlink()
            with contextlib.suppress(OSError):
                shard.rmdir()
        return freed


def _copy_range(source: int, target: int, size: int) -> None:
    """``size`` bytes in the kernel (``copy_file_range``), with a read/write fallback."""
    left = size
    try:
        while left > 0:
            done = os.copy_file_range(source, target, min(left, 1 << 30))
            if done == 0:
                break
            left -= done
    except OSError:
        os.lseek(source, size - left, os.SEEK_SET)
        while chunk := os.read(source, CHUNK):
            os.write(target, chunk)
        return
    if left:
        raise SnapshotCorruptError("an object is shorter than when it was checked")
