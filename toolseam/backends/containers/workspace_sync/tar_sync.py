"""The base dir, copied into a sandbox that shares no filesystem with the host, and back.

``pack`` makes the tar the engine unpacks into the sandbox's workspace and remembers what it
sent (the *baseline*). ``spool`` takes the engine's archive of the workspace as it streams in,
refusing it on its tar headers as soon as the declared sizes pass the copy limit. ``apply``
brings the sandbox's changes home — added, modified and deleted files, directories and
symlinks. What comes back is untrusted input (the sandbox runs whatever a model writes), so
every copy-back follows one policy, enforced here and nowhere else:

* **what comes home**: regular files, directories and symlinks (as links, never followed).
  A hard link's second name becomes a regular file with its target's content. Fifos, devices,
  sockets, hard links to anything but a file of the same archive, and names that leave the
  base dir or do not fit the host's name limit are *refused*: listed in ``SyncReport.refused``,
  and the host keeps whatever it has at that name and below it — a refused name is never read
  as the sandbox deleting it;
* **modes**: permission bits only (never setuid, setgid or sticky), group and other write
  dropped unless ``keep_group_write``; owner: the host process's user (every file is created
  anew by this process; a directory the host already had keeps its owner); modification times
  clamped to what the host filesystem takes;
* **the conflict rule**: a path the sandbox changed and the host left alone since the baseline
  takes the sandbox's version; a path both changed keeps the host's version, and the sandbox's
  is written beside it as ``NAME.toolseam-conflict`` (``-2``, ``-3`` … when that name is taken
  by anything but this session's own earlier copy; the name shortened by bytes to fit); a
  deletion by the sandbox of a path the host changed just leaves the host's;
* **all or nothing**: every file and link is first written into a staging directory on the
  same filesystem (``.toolseam-sync-*``, short names that always fit), then the changes are
  applied by renames, each replaced or deleted entry kept in staging until the end; any
  failure (a name, a full disk, an I/O error, the host changing a path meanwhile, a malformed
  or truncated archive) puts every applied step back and raises one ``CopyBackError`` saying
  what failed and that the sandbox's work is still in the sandbox;
* nothing is ever written outside the base dir: every directory on the way is opened with
  ``O_NOFOLLOW`` below the base dir's own descriptor.

Neither the tar module's ``extractall`` (it writes through paths, its filters refuse rather
than report, and it stops half-way) nor ``shutil`` does a three-way merge applied all or
nothing with descriptor-relative writes, so this is written by hand; ``tarfile`` parses.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from typing import IO

from ....seam.models import SyncReport
from .apply import CopyBack
from .host_ops import HostOps
from .policy import (
    CHUNK,
    DEFAULT_COPY_LIMIT,
    STAGING_PREFIX,
    CopyBackError,
    CopyLimitError,
    Entry,
    as_root,
    check_end,
    check_name,
    describe,
    policy_mode,
)


class WorkspaceCopy:
    """The baseline of one sandbox's copy of ``base``; ``pack`` first, then ``spool`` and
    ``apply`` any number of times (each apply moves the baseline to what it brought home)."""

    def __init__(self, base: str, limit: int = DEFAULT_COPY_LIMIT, *,
                 keep_group_write: bool = False) -> None:
        self.base = os.path.abspath(base)
        self.limit = limit
        self.keep_group_write = keep_group_write
        self.baseline: dict[str, Entry] = {}
        # conflict copies this session made: the sandbox's path -> (copy's path, its stamp);
        # an unchanged earlier copy is replaced by a later one instead of numbering a new one
        self.copies: dict[str, tuple[str, tuple[int, int]]] = {}
        self.host_ops: HostOps = HostOps()  # every change to the host goes through here (tests fail it)

    # --- host → sandbox -------------------------------------------------------------------
    def pack(self, out: IO[bytes]) -> int:
        """Write the base dir as a tar to ``out`` (entries relative, owned by root); returns the
        number of content bytes. Symlinks go as symlinks; nothing they point to is read.
        It walks by path, which only a reader racing no sandbox may (decision 510): the base
        dir is the caller's and no sandbox of a copy sees it — copy mode seeds the sandbox's
        own volume through the engine (``modes/copy.py``), the remote client's open sends
        bytes (``remote/copied.py``), and what the sandbox makes comes home as an archive
        ``apply`` reads."""
        total = 0
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, st in self._walk_host():
                info = tarfile.TarInfo(rel)
                info.mode, info.mtime, info.uid, info.gid = stat.S_IMODE(st.st_mode), int(st.st_mtime), 0, 0
                stamp = (st.st_size, st.st_mtime_ns)
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                    self.baseline[rel] = Entry("dir", self._mode(info.mode), "", host_stamp=stamp)
                elif stat.S_ISLNK(st.st_mode):
                    info.type, info.linkname = tarfile.SYMTYPE, os.readlink(self._host(rel))
                    tar.addfile(info)
                    self.baseline[rel] = Entry("link", 0, info.linkname, host_stamp=stamp)
                else:
                    total += st.st_size
                    if total > self.limit:
                        raise CopyLimitError(f"the base dir {self.base}", self.limit)
                    fd = os.open(self._host(rel), os.O_RDONLY | os.O_NOFOLLOW)
                    with os.fdopen(fd, "rb") as source:
                        hashing = _HashingReader(source)
                        info.size = st.st_size
                        tar.addfile(info, hashing)
                    self.baseline[rel] = Entry("file", self._mode(info.mode), hashing.hexdigest(),
                                               st.st_size, stamp)
        return total

    def _mode(self, mode: int) -> int:
        return policy_mode(mode, self.keep_group_write)

    def _walk_host(self) -> Iterator[tuple[str, os.stat_result]]:
        stack = [""]
        while stack:
            rel_dir = stack.pop()
            with os.scandir(self._host(rel_dir) if rel_dir else self.base) as it:
                for item in sorted(it, key=lambda e: e.name):
                    if item.name.startswith(STAGING_PREFIX):
                        continue  # a copy-back in progress (or one a crash left): not the user's
                    rel = f"{rel_dir}/{item.name}" if rel_dir else item.name
                    st = item.stat(follow_symlinks=False)
                    if stat.S_ISDIR(st.st_mode):
                        yield rel, st
                        stack.append(rel)
                    elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                        yield rel, st
                    # sockets, fifos and devices have no meaning in a copy: left out

    def _host(self, rel: str) -> str:
        return os.path.join(self.base, rel)

    @staticmethod
    def pack_upload(local: str, arcname: str, out: IO[bytes]) -> None:
        """A tar of ``local`` (a file or directory) named ``arcname``, as ``pack`` makes them:
        files, directories and symlinks, owned by root."""
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(local, arcname=arcname, filter=lambda info: as_root(info) if (
                info.isfile() or info.isdir() or info.issym()) else None)

    def remember_uploaded(self, tar_path: str, prefix: str) -> None:
        """The uploaded paths join the baseline as the sandbox's own (``host_stamp`` None: a
        later ``apply`` brings them home only if the sandbox changes them, as additions)."""
        with tarfile.open(tar_path) as tar:
            for member in tar:
                rel = check_name(f"{prefix}/{member.name}" if prefix else member.name)
                entry = self.entry_of(tar, member)
                if rel is not None and entry is not None:
                    self.baseline[rel] = entry

    def entry_of(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> Entry | None:
        """What a plain member (file, directory, symlink) is under the policy; None for others."""
        if member.isdir():
            return Entry("dir", self._mode(member.mode), "")
        if member.issym():
            return Entry("link", 0, member.linkname)
        if member.isreg():
            source = tar.extractfile(member)
            assert source is not None
            digest = hashlib.sha256()
            while chunk := source.read(CHUNK):
                digest.update(chunk)
            return Entry("file", self._mode(member.mode), digest.hexdigest(), member.size)
        return None

    # --- sandbox → host -------------------------------------------------------------------
    def spool(self, chunks: Iterable[bytes], what: str) -> IO[bytes]:
        """The engine's archive stream in a temporary file. Its tar headers are read as they
        arrive: past the copy limit in declared content, it is refused before those bytes are
        read, so a refused copy-back costs about nothing. A stream the engine cut short or
        spoiled is a retryable ``CopyBackError`` (nothing was applied)."""
        spool = tempfile.TemporaryFile(prefix="toolseam-copy-")  # noqa: SIM115 - handed to the caller
        reader = _Tee(iter(chunks), spool, self.limit + (self.limit >> 4) + (1 << 20), what,
                      self.limit)
        try:
            try:
                with tarfile.open(fileobj=reader, mode="r|") as tar:
                    declared = 0
                    for member in tar:
                        if member.isreg():
                            declared += member.size
                            if declared > self.limit:
                                raise CopyLimitError(what, self.limit)
                    reader.drain()
                    check_end(spool, tar.offset)
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise CopyBackError(f"reading {what} from the engine: {describe(exc)}",
                                    base=self.base, retryable=True) from exc
            spool.seek(0)
        except BaseException:
            spool.close()
            raise
        return spool

    def apply(self, archive: IO[bytes], source: str = "the sandbox") -> SyncReport:
        """Bring home what the sandbox changed since the baseline, from the engine's archive of
        its whole workspace, all or nothing (see the module's docstring). The archive's first
        entry is the workspace directory itself, and names every other entry below it:
        ``workspace/a.txt`` from docker and a running podman, ``/a.txt`` below an entry named
        ``""`` from a stopped podman container. An archive without that first directory, or
        without its end (cut short), is refused whole — read as "everything (after the cut)
        was deleted" it would empty the base dir. ``source`` says where the sandbox's work
        stays when the copy-back fails (the container, its volume)."""
        try:
            base_fd = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as exc:
            raise CopyBackError(f"opening the base dir: {describe(exc)}", base=self.base,
                                retryable=False, source=source) from exc
        try:
            try:
                tar = tarfile.open(fileobj=archive, mode="r:")  # noqa: SIM115 - closed below
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise CopyBackError(f"the engine's archive is not a tar ({describe(exc)})",
                                    base=self.base, retryable=True, source=source) from exc
            with tar:
                run = CopyBack(self, base_fd, tar, source)
                return run.go(archive)
        finally:
            os.close(base_fd)


class _Tee(io.RawIOBase):
    """The engine's chunks as a file for ``tarfile``'s stream mode, each byte handed on also
    written to the spool; past ``cap`` bytes in all (headers on top of the limit) it stops."""

    def __init__(self, chunks: Iterator[bytes], spool: IO[bytes], cap: int, what: str,
                 limit: int) -> None:
        self.chunks, self.spool, self.cap, self.what, self.limit = chunks, spool, cap, what, limit
        self.pending = memoryview(b"")
        self.total = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self.pending:
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.pending = memoryview(chunk)
        n = min(len(buffer), len(self.pending))
        data, self.pending = self.pending[:n], self.pending[n:]  # views: no copying per read
        self.total += n
        if self.total > self.cap:
            raise CopyLimitError(self.what, self.limit)
        self.spool.write(data)
        buffer[:n] = data
        return n

    def drain(self) -> None:
        """The rest after the last header tarfile read (the end-of-archive blocks)."""
        while self.read(CHUNK):
            pass


class _HashingReader(io.RawIOBase):
    """A file read through once, for the tar and for its digest at the same time."""

    def __init__(self, source: IO[bytes]) -> None:
        self.source = source
        self.digest = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.digest.update(data)
        return data

    def hexdigest(self) -> str:
        return self.digest.hexdigest()
