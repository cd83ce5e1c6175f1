"""The base dir, copied into a sandbox that shares no filesystem with the host, and back.

``pack`` makes the tar the engine unpacks into the sandbox's workspace and remembers what it
sent (the *baseline*). ``apply`` reads the tar the engine gives back and brings the sandbox's
changes home — added, modified and deleted files, directories and symlinks — by this rule:

* a path the sandbox changed and the host left alone since the baseline takes the sandbox's
  version, each file replaced atomically (written beside, then renamed over);
* a path both changed is a **conflict**: the host's version stays, the sandbox's is written
  beside it as ``NAME.toolseam-conflict`` (a deletion by the sandbox just leaves the host's
  file), and the report lists it — never silent loss on either side;
* nothing is ever written outside the base dir: every directory on the way is opened with
  ``O_NOFOLLOW`` below the base dir's own descriptor, so a symlink the sandbox arranged is
  refused, not followed; names with ``..``, absolute names and special files are refused.

Neither the tar module's ``extractall`` (it writes through paths, and its filters refuse
rather than report) nor ``shutil`` does a three-way merge with descriptor-relative writes, so
this is written by hand.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
import tarfile
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import IO, Literal

from ..seam.errors import CouldNotRunError
from ..seam.models import SyncReport

Kind = Literal["file", "dir", "link"]
CONFLICT_SUFFIX = ".toolseam-conflict"
DEFAULT_COPY_LIMIT = 2 << 30  # bytes either way; a clear error past it
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Entry:
    kind: Kind
    mode: int  # permission bits only
    digest: str  # sha256 of a file's bytes, a link's target, "" for a directory
    size: int = 0
    host_stamp: tuple[int, int] | None = None  # (size, mtime_ns) on the host when last in sync

    def same_content(self, other: Entry) -> bool:
        return (self.kind, self.mode, self.digest) == (other.kind, other.mode, other.digest)


class CopyLimitError(CouldNotRunError):
    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"{what} is larger than the copy limit of {limit} bytes; raise "
                         "copy_limit or make the workspace smaller", retryable=False)


def as_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """A tar entry owned by the container's root, whoever owns the file here."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _check_name(name: str) -> str | None:
    """The relative path a tar member names, or None when it would leave the base dir."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts or "\x00" in name:
        return None
    return "/".join(parts)


class WorkspaceCopy:
    """The baseline of one sandbox's copy of ``base``; ``pack`` first, then ``apply`` any
    number of times (each apply moves the baseline to what it brought home)."""

    def __init__(self, base: str, limit: int = DEFAULT_COPY_LIMIT) -> None:
        self.base = os.path.abspath(base)
        self.limit = limit
        self.baseline: dict[str, Entry] = {}

    # --- host → sandbox -------------------------------------------------------------------
    def pack(self, out: IO[bytes]) -> int:
        """Write the base dir as a tar to ``out`` (entries relative, owned by root); returns the
        number of content bytes. Symlinks go as symlinks; nothing they point to is read."""
        total = 0
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, st in self._walk_host():
                info = tarfile.TarInfo(rel)
                info.mode, info.mtime, info.uid, info.gid = stat.S_IMODE(st.st_mode), int(st.st_mtime), 0, 0
                stamp = (st.st_size, st.st_mtime_ns)
                if stat.S_ISDIR(st.st_mode):
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                    self.baseline[rel] = Entry("dir", info.mode, "", host_stamp=stamp)
                elif stat.S_ISLNK(st.st_mode):
                    info.type, info.linkname = tarfile.SYMTYPE, os.readlink(self._host(rel))
                    tar.addfile(info)
                    self.baseline[rel] = Entry("link", info.mode, info.linkname, host_stamp=stamp)
                else:
                    total += st.st_size
                    if total > self.limit:
                        raise CopyLimitError(f"the base dir {self.base}", self.limit)
                    fd = os.open(self._host(rel), os.O_RDONLY | os.O_NOFOLLOW)
                    with os.fdopen(fd, "rb") as source:
                        hashing = _HashingReader(source)
                        info.size = st.st_size
                        tar.addfile(info, hashing)
                    self.baseline[rel] = Entry("file", info.mode, hashing.hexdigest(),
                                               st.st_size, stamp)
        return total

    def _walk_host(self) -> Iterator[tuple[str, os.stat_result]]:
        stack = [""]
        while stack:
            rel_dir = stack.pop()
            with os.scandir(self._host(rel_dir) if rel_dir else self.base) as it:
                for item in sorted(it, key=lambda e: e.name):
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
            for member, entry in _entries(tar):
                rel = _check_name(f"{prefix}/{member.name}" if prefix else member.name)
                if rel is not None:
                    self.baseline[rel] = replace(entry, host_stamp=None)

    # --- sandbox → host -------------------------------------------------------------------
    def spool(self, chunks: Iterable[bytes], what: str) -> IO[bytes]:
        """The engine's archive stream in a temporary file, refused past the copy limit before
        anything is applied."""
        spool = tempfile.TemporaryFile(prefix="toolseam-copy-")  # noqa: SIM115 - handed to the caller
        size = 0
        try:
            for chunk in chunks:
                size += len(chunk)
                if size > self.limit + (self.limit >> 4) + (1 << 20):  # tar headers on top
                    raise CopyLimitError(what, self.limit)
                spool.write(chunk)
            spool.seek(0)
        except BaseException:
            spool.close()
            raise
        return spool

    def apply(self, archive: IO[bytes]) -> SyncReport:
        """Bring home what the sandbox changed since the baseline, from the engine's archive of
        its whole workspace. The archive's first entry is the workspace directory itself, and
        names every other entry below it: ``workspace/a.txt`` from docker and a running podman,
        ``/a.txt`` below an entry named ``""`` from a stopped podman container. An archive
        without that first directory is refused whole — read as "everything was deleted" it
        would empty the base dir."""
        report = SyncReport()
        with tarfile.open(fileobj=archive) as tar:
            first = tar.next()
            if first is None or not first.isdir():
                raise CouldNotRunError("the engine's archive of the sandbox's workspace does not "
                                       "start with the workspace directory; nothing was copied "
                                       "back", retryable=True)
            prefix = first.name.rstrip("/") + "/"
            sandbox: dict[str, tuple[tarfile.TarInfo, Entry]] = {}
            for member, entry in _entries(tar, report, prefix):
                if member is first:
                    continue
                inside = member.name.startswith(prefix)
                rel = _check_name(member.name[len(prefix):]) if inside else None
                if rel is None:
                    report.refused.append(member.name[len(prefix):] if inside else member.name)
                    continue
                sandbox[rel] = (member, entry)
            content = sum(e.size for _, e in sandbox.values() if e.kind == "file")
            if content > self.limit:
                raise CopyLimitError("the sandbox's workspace", self.limit)
            base_fd = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY)
            try:
                writer = _Writer(base_fd, tar, report)
                deleted = [p for p in self.baseline if p not in sandbox]
                for rel in sorted(deleted, key=lambda p: p.count("/"), reverse=True):
                    self._delete(writer, rel)
                for rel in sorted(sandbox):
                    member, entry = sandbox[rel]
                    self._bring(writer, rel, member, entry)
            finally:
                os.close(base_fd)
        return report

    def _host_unchanged(self, writer: _Writer, rel: str, before: Entry | None) -> bool:
        now = writer.lstat(rel)
        if before is None or before.host_stamp is None:
            return now is None  # nothing there before, nothing there now
        if now is None:
            return False
        kind = _kind(now.st_mode)
        if kind != before.kind or (kind != "dir" and (now.st_size, now.st_mtime_ns) != before.host_stamp):
            return False
        return kind == "dir" or stat.S_IMODE(now.st_mode) == before.mode

    def _delete(self, writer: _Writer, rel: str) -> None:
        before = self.baseline.pop(rel)
        if before.host_stamp is None or writer.lstat(rel) is None:
            return  # an upload the sandbox removed (the host never had it), or gone from both
        if not self._host_unchanged(writer, rel, before) and before.kind != "dir":
            writer.report.conflicts.append(rel)  # the host changed it: the host's version stays
            return
        if writer.remove(rel, before.kind):
            writer.report.deleted.append(rel)

    def _bring(self, writer: _Writer, rel: str, member: tarfile.TarInfo, entry: Entry) -> None:
        before = self.baseline.get(rel)
        if before is not None and before.same_content(entry):
            return  # the sandbox left it as it was
        host_now = writer.lstat(rel)
        if host_now is not None and writer.matches(rel, host_now, entry):
            self.baseline[rel] = replace(entry, host_stamp=_stamp(host_now))
            return  # the host already has exactly this
        changed = before is not None and before.host_stamp is not None
        if entry.kind == "dir" and host_now is not None and _kind(host_now.st_mode) == "dir":
            writer.chmod(rel, entry.mode)
        elif not self._host_unchanged(writer, rel, before if changed else None):
            writer.report.conflicts.append(rel)
            if entry.kind != "dir":
                writer.place(rel + CONFLICT_SUFFIX, member, entry)
            self.baseline[rel] = replace(entry, host_stamp=None)
            return
        elif not writer.place(rel, member, entry):
            return
        (writer.report.modified if changed else writer.report.added).append(rel)
        stamp = writer.lstat(rel)
        self.baseline[rel] = replace(entry, host_stamp=_stamp(stamp) if stamp else None)


def _stamp(st: os.stat_result) -> tuple[int, int]:
    return st.st_size, st.st_mtime_ns


def _kind(mode: int) -> Kind | None:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "file" if stat.S_ISREG(mode) else None


def _entries(tar: tarfile.TarFile, report: SyncReport | None = None, prefix: str = ""
             ) -> Iterator[tuple[tarfile.TarInfo, Entry]]:
    for member in tar:
        mode = member.mode & 0o7777
        if member.isdir():
            yield member, Entry("dir", mode, "")
        elif member.issym():
            yield member, Entry("link", mode, member.linkname)
        elif member.isfile():
            source = tar.extractfile(member)
            assert source is not None
            digest = hashlib.sha256()
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
            yield member, Entry("file", mode, digest.hexdigest(), member.size)
        elif report is not None:  # hard links, devices, fifos: no place in a copy
            report.refused.append(member.name.removeprefix(prefix))


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


class _Writer:
    """Descriptor-relative changes below the base dir; every directory on the way is opened
    with O_NOFOLLOW, so no symlink (the sandbox's or anyone's) leads a write outside."""

    def __init__(self, base_fd: int, tar: tarfile.TarFile, report: SyncReport) -> None:
        self.base_fd = base_fd
        self.tar = tar
        self.report = report

    @contextlib.contextmanager
    def parent(self, rel: str, create: bool = False) -> Iterator[tuple[int, str]]:
        *dirs, name = rel.split("/")
        fd = os.dup(self.base_fd)
        try:
            for part in dirs:
                try:
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(part, 0o755, dir_fd=fd)
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = nxt
            yield fd, name
        finally:
            os.close(fd)

    def lstat(self, rel: str) -> os.stat_result | None:
        try:
            with self.parent(rel) as (fd, name):
                return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlink on the way: nothing of ours is there
                return None
            raise

    def matches(self, rel: str, st: os.stat_result, entry: Entry) -> bool:
        kind = _kind(st.st_mode)
        if kind != entry.kind or (kind != "link" and stat.S_IMODE(st.st_mode) != entry.mode):
            return False
        if kind == "link":
            with self.parent(rel) as (fd, name):
                return os.readlink(name, dir_fd=fd) == entry.digest
        if kind == "file":
            if st.st_size != entry.size:
                return False
            with self.parent(rel) as (fd, name):
                source = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
            digest = hashlib.sha256()
            with os.fdopen(source, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
            return digest.hexdigest() == entry.digest
        return True

    def chmod(self, rel: str, mode: int) -> None:
        with self.parent(rel) as (fd, name):
            os.chmod(name, mode, dir_fd=fd, follow_symlinks=False)

    def remove(self, rel: str, kind: Kind) -> bool:
        try:
            with self.parent(rel) as (fd, name):
                if kind == "dir":
                    os.rmdir(name, dir_fd=fd)
                else:
                    os.unlink(name, dir_fd=fd)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # the host added files in it
                self.report.conflicts.append(rel)
                return False
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                self.report.refused.append(rel)
                return False
            raise

    def place(self, rel: str, member: tarfile.TarInfo, entry: Entry) -> bool:
        """Create or replace ``rel`` with the sandbox's version; False when refused."""
        try:
            with self.parent(rel, create=True) as (fd, name):
                current = None
                with contextlib.suppress(FileNotFoundError):
                    current = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if entry.kind == "dir":
                    if current is not None and not stat.S_ISDIR(current.st_mode):
                        os.unlink(name, dir_fd=fd)
                    if current is None or not stat.S_ISDIR(current.st_mode):
                        os.mkdir(name, entry.mode, dir_fd=fd)
                    os.chmod(name, entry.mode, dir_fd=fd)
                    return True
                if current is not None and stat.S_ISDIR(current.st_mode):
                    os.rmdir(name, dir_fd=fd)  # the sandbox made a directory a file
                temp = f".{name[:200]}.{uuid.uuid4().hex[:8]}.toolseam-tmp"
                try:
                    if entry.kind == "link":
                        os.symlink(entry.digest, temp, dir_fd=fd)
                    else:
                        self._write(fd, temp, member, entry)
                    os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(temp, dir_fd=fd)
                    raise
            return True
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOTEMPTY):
                self.report.refused.append(rel)
                return False
            raise

    def _write(self, fd: int, temp: str, member: tarfile.TarInfo, entry: Entry) -> None:
        source = self.tar.extractfile(member)
        assert source is not None
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
        with os.fdopen(out, "wb") as target:
            while chunk := source.read(_CHUNK):
                target.write(chunk)
            os.fchmod(target.fileno(), entry.mode)
            self.report.bytes_copied += member.size
        mtime_ns = int(member.mtime * 10**9)
        os.utime(temp, ns=(mtime_ns, mtime_ns), dir_fd=fd)
