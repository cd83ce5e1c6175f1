"""Snapshots of a tree this process cannot open, only read and write as a tar archive: a
copy-mode container's workspace, through its engine's archive API (decision 400).

* ``capture_archive`` reads the engine's archive of the workspace as a stream: each member's
  name is checked as a manifest's is (``manifest.check_name``), files go into the store as they
  pass, set-id bits are dropped, a hard link names the bytes of the file it links to, fifos
  and devices are left out, and the size limit is checked on each header before its bytes are
  read (a sparse 10 GB file never reaches the disk).
* ``restore_archive`` is the other way: the manifest, checked whole, as a tar of relative
  names, parents first, each object's bytes checked against its digest as they are copied in
  (a tampered object stops the restore before the sandbox is touched).
"""

from __future__ import annotations

import functools
import os
import posixpath
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO

from .capture import Captured, Known, SnapshotLimitError, StatKey
from .manifest import (
    KEPT_MODE_BITS,
    WORKING_PREFIXES,
    Entry,
    Manifest,
    SnapshotCorruptError,
    check_name,
    checked_tree,
)
from .store import CHUNK, SnapshotStore
from .unchanged_dirs import SAME_HEADER, Child, UnchangedDirs


class ChunkReader:
    """An iterator of byte chunks as the file object ``tarfile``'s stream mode reads."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._left = b""

    def read(self, size: int = -1) -> bytes:
        while size < 0 or len(self._left) < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._left += chunk
        if size < 0:
            size = len(self._left)
        out, self._left = self._left[:size], self._left[size:]
        return out


# Headers a sandbox's pack adds (toolseam_agent/pack.py): a file's stat key, and "unchanged
# since the key the host gave" (no bytes follow; the host's known digest stands); a directory's
# sum and "unchanged" are unchanged_dirs.py's.
KEY_HEADER = "TOOLSEAM.key"


def _stat_key(member: tarfile.TarInfo) -> StatKey | None:
    parts = member.pax_headers.get(KEY_HEADER, "").split(":")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        return None
    ino, size, mtime_ns, ctime_ns = (int(p) for p in parts)
    return ino, size, mtime_ns, ctime_ns


def capture_archive(chunks: Iterable[bytes], store: SnapshotStore, limit: int,
                    known: Known | None = None, *, relative: bool = False) -> Captured:
    """The tree an engine's archive of one directory holds (its first name component is that
    directory and is dropped) into ``store``. ``known``: the stat keys and digests of the
    files a previous snapshot of the same tree stored (a layer pack): a member marked
    unchanged keeps its digest without bytes; the keys seen are in the result's ``known``.
    ``relative``: the names are the tree's own (``x`` or ``./x``, as ``tar -C DIR -cf - .``
    makes them: the OpenAI Agents SDK's)."""
    entries: list[Entry] = []
    left_out: list[str] = []
    digests: dict[str, str] = {}  # a file's name in the archive -> its digest, for hard links
    now = Known()
    trusted = known is not None and known.source is not None and store.has_snapshot(
        known.source)
    unchanged = UnchangedDirs(known, trusted, now)
    added = total = 0
    top = ""  # the archive's first name component (the directory it is of)

    def place(children: list[Child]) -> None:  # entries of a directory said unchanged
        nonlocal total
        for _, path, entry in children:
            if entry is None:
                left_out.append(path)
                continue
            entries.append(entry)
            if entry.kind == "file":
                total += entry.size
                if total > limit:
                    raise SnapshotLimitError(path, limit)
                digests[f"{top}/{path}"] = entry.digest
                seen = known.files.get(path) if known is not None else None
                if seen is not None:
                    now.files[path] = seen
    with tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            head, _, rest = member.name.partition("/")
            path = (_own_name(member.name) if relative else rest).rstrip("/")
            top = top or head
            if path and path.split("/")[0].startswith(WORKING_PREFIXES):
                continue
            place(unchanged.before(path))
            if member.isdir():
                unchanged.directory(path, member)
            if not path:
                continue
            check_name(path)
            mode = member.mode & KEPT_MODE_BITS
            mtime_ns = int(member.mtime * 1_000_000_000)
            entry: Entry | None = None
            if member.isdir():
                entries.append(Entry(path, "dir", mode, "", 0, mtime_ns))
                continue
            if member.issym():
                entry = Entry(path, "link", 0, member.linkname, len(member.linkname), mtime_ns)
            elif member.isreg():
                key = _stat_key(member)
                seen = known.files.get(path) if known is not None else None
                if member.pax_headers.get(SAME_HEADER) == "1":
                    if key is None or seen is None or seen[0] != key or not trusted:
                        raise SnapshotCorruptError(f"{path!r} is said unchanged, and is not")
                    size, digest = key[1], seen[1]
                else:
                    size = member.size
                total += size
                if total > limit:
                    raise SnapshotLimitError(path, limit)
                if member.pax_headers.get(SAME_HEADER) != "1":
                    source = tar.extractfile(member)
                    assert source is not None
                    digest, grew = store.ingest_from(functools.partial(source.read, CHUNK))
                    added += grew
                if key is not None:
                    now.files[path] = (key, digest)
                digests[member.name] = digest
                entry = Entry(path, "file", mode, digest, size, mtime_ns)
            elif member.islnk() and member.linkname in digests:
                entry = Entry(path, "file", mode, digests[member.linkname], member.size,
                              mtime_ns)
            if entry is None:
                left_out.append(path)
            else:
                entries.append(entry)
            unchanged.child(path, entry)
        place(unchanged.end())
    checked_tree(entries)  # every name below a directory of the same archive
    return Captured(entries, added, left_out, now)


def _own_name(name: str) -> str:
    """A relative archive's name without its ``./`` ("." itself: the root, no entry)."""
    while name.startswith("./"):
        name = name[2:]
    return "" if name == "." else name


def restore_archive(manifest: Manifest, store: SnapshotStore, out: IO[bytes], *,
                    whole: bool = False) -> tuple[int, list[Entry]]:
    """The snapshot's tree as a tar archive of relative names written to ``out``; how many
    files it holds, and the links it leaves out: docker refuses to extract a link whose
    relative target climbs above the directory it extracts into (``../x`` at the top), so
    those are made afterwards (``late_links``). Directories are made writable by their owner
    while they are filled (a 0500 directory's files could not be written by a sandbox root
    without ``CAP_DAC_OVERRIDE``): their modes come last (``late_modes``). ``whole``: every
    link and every directory's own mode in the archive (for an extractor that sets a
    directory's mode after filling it, as GNU tar does: the OpenAI Agents SDK's hydrate)."""
    tree = checked_tree(manifest.entries)
    files = 0
    late: list[Entry] = []
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(tree.values(), key=lambda e: (e.path.count("/"), e.path)):
            info = tarfile.TarInfo(entry.path)
            info.mtime = entry.mtime_ns / 1_000_000_000
            info.mode = entry.mode
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                info.mode = entry.mode if whole else entry.mode | 0o700
                tar.addfile(info)
            elif entry.kind == "link":
                if not whole and _climbs_out(entry.path, entry.digest):
                    late.append(entry)
                    continue
                info.type, info.linkname = tarfile.SYMTYPE, entry.digest
                tar.addfile(info)
            else:
                with tempfile.TemporaryFile(prefix="toolseam-restore-") as data:
                    store.copy_out(entry.digest, data.fileno())  # checked as it is copied
                    info.size = data.tell()
                    data.seek(0)
                    tar.addfile(info, data)
                files += 1
    return files, late


def _climbs_out(path: str, target: str) -> bool:
    """A relative link target that leads above the root the link's path is relative to."""
    if target.startswith("/"):
        return False
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
    return joined == ".." or joined.startswith("../")


def _shell_bytes(text: str) -> str:
    """``text``'s bytes (names that are not UTF-8 included) as a POSIX shell word that makes
    them: printf with an octal escape per byte, nothing for the shell to read as syntax."""
    octal = "".join(f"\\{byte:03o}" for byte in os.fsencode(text))
    return f'"$(printf \'{octal}\')"'


def finishing_script(manifest: Manifest, late_links: list[Entry]) -> str | None:
    """What a restore through an archive leaves to a command in the sandbox, run in the
    restored root: the links the archive could not hold, then the modes of directories that
    are not owner-rwx (deepest first). None when there is nothing."""
    steps = [f"ln -s -- {_shell_bytes(e.digest)} ./{_shell_bytes(e.path)}" for e in late_links]
    dirs = [e for e in manifest.entries if e.kind == "dir" and e.mode & 0o700 != 0o700]
    steps += [f"chmod {e.mode:o} -- ./{_shell_bytes(e.path)}"
              for e in sorted(dirs, key=lambda e: -e.path.count("/"))]
    return " && ".join(steps) or None
