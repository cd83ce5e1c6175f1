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
from dataclasses import dataclass, field, replace
from typing import IO, Literal

from ....seam.errors import CouldNotRunError
from ....seam.models import SyncReport

Kind = Literal["file", "dir", "link"]
CONFLICT_SUFFIX = ".toolseam-conflict"
STAGING_PREFIX = ".toolseam-sync-"
DEFAULT_COPY_LIMIT = 2 << 30  # bytes either way; a clear error past it
_CHUNK = 1 << 20
_NAME_MAX = 255  # when the filesystem does not say
_TIME_MAX_NS = (2**31 - 1) * 10**9  # a time every filesystem takes (2038): the fallback clamp


@dataclass(frozen=True)
class Entry:
    kind: Kind
    mode: int  # permission bits only (0 for a symlink: its own bits mean nothing)
    digest: str  # sha256 of a file's bytes, a link's target, "" for a directory
    size: int = 0
    host_stamp: tuple[int, int] | None = None  # (size, mtime_ns) on the host when last in sync

    def same_content(self, other: Entry) -> bool:
        return (self.kind, self.mode, self.digest) == (other.kind, other.mode, other.digest)


class CopyLimitError(CouldNotRunError):
    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"{what} is larger than the copy limit of {limit} bytes; raise "
                         "copy_limit or make the workspace smaller; nothing was copied",
                         retryable=False)


class CopyBackError(CouldNotRunError):
    """A copy-back that failed; the base dir was put back exactly as it was before it (unless
    ``restored`` is False, and then the message says which entries to look for where)."""

    def __init__(self, what: str, *, base: str, retryable: bool, restored: bool = True,
                 source: str = "the sandbox") -> None:
        state = (f"the base dir {base} was left exactly as it was" if restored else
                 f"the base dir {base} could NOT be fully restored")
        super().__init__(f"copying the sandbox's changes home failed: {what}; {state}; the "
                         f"sandbox's work is still in {source}", retryable=retryable)
        self.what = what
        self.restored = restored


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


def policy_mode(mode: int, keep_group_write: bool = False) -> int:
    """The permission bits a copy-back gives a file or directory: no setuid, setgid or sticky
    bit ever; group and other write only when asked for."""
    return mode & (0o777 if keep_group_write else 0o755)


def fit_name(name: str, suffix: str, name_max: int = _NAME_MAX) -> str:
    """``name + suffix`` within ``name_max`` bytes, the name cut by bytes where it must be and
    never inside a UTF-8 character."""
    raw, tail = os.fsencode(name), os.fsencode(suffix)
    room = name_max - len(tail)
    if len(raw) <= room:
        return name + suffix
    cut = raw[:max(room, 0)]
    # drop a multibyte character the cut split: its lead byte and the continuations after it
    end = len(cut)
    back = end - 1
    while back >= 0 and cut[back] & 0xC0 == 0x80:
        back -= 1
    if back >= 0 and cut[back] >= 0xC0:
        need = 2 if cut[back] < 0xE0 else 3 if cut[back] < 0xF0 else 4
        if end - back < need:
            cut = cut[:back]
    return os.fsdecode(cut) + suffix


def clamp_mtime_ns(mtime: float | int) -> int:
    """A tar member's modification time in nanoseconds, within what ``os.utime`` can pass."""
    try:
        ns = mtime * 10**9 if isinstance(mtime, int) else int(mtime * 10**9)
    except (OverflowError, ValueError):  # inf, nan
        return 0
    return max(0, min(int(ns), 2**63 - 1))


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
        self._ops: _Ops = _Ops()  # every change to the host goes through here (tests fail it)

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
                rel = _check_name(f"{prefix}/{member.name}" if prefix else member.name)
                entry = self._entry(tar, member)
                if rel is not None and entry is not None:
                    self.baseline[rel] = entry

    def _entry(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> Entry | None:
        """What a plain member (file, directory, symlink) is under the policy; None for others."""
        if member.isdir():
            return Entry("dir", self._mode(member.mode), "")
        if member.issym():
            return Entry("link", 0, member.linkname)
        if member.isreg():
            source = tar.extractfile(member)
            assert source is not None
            digest = hashlib.sha256()
            while chunk := source.read(_CHUNK):
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
                    _check_end(spool, tar.offset)
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise CopyBackError(f"reading {what} from the engine: {_describe(exc)}",
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
            raise CopyBackError(f"opening the base dir: {_describe(exc)}", base=self.base,
                                retryable=False, source=source) from exc
        try:
            try:
                tar = tarfile.open(fileobj=archive, mode="r:")  # noqa: SIM115 - closed below
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise CopyBackError(f"the engine's archive is not a tar ({_describe(exc)})",
                                    base=self.base, retryable=True, source=source) from exc
            with tar:
                run = _Sync(self, base_fd, tar, source)
                return run.go(archive)
        finally:
            os.close(base_fd)


def _check_end(archive: IO[bytes], offset: int) -> None:
    """tarfile takes a cut in the stream at a header for the archive's end; the engines'
    archives end with two zero blocks, and without them the rest would read as deleted."""
    archive.seek(offset)
    end = archive.read(2 * tarfile.BLOCKSIZE)
    if len(end) < 2 * tarfile.BLOCKSIZE or end.strip(b"\0"):
        raise tarfile.ReadError(f"no end-of-archive marker at byte {offset}")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where} [{errno.errorcode.get(exc.errno or 0, exc.errno)}]"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


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
        while self.read(_CHUNK):
            pass


@dataclass
class _Item:
    """One name the sandbox has, under the policy; ``member`` holds a file's bytes (for a hard
    link, its target's)."""

    entry: Entry
    member: tarfile.TarInfo


@dataclass
class _Step:
    """One change to the host, planned before anything changes. ``expect`` is what the plan saw
    at ``target`` (None: nothing), checked again right before the change."""

    action: Literal["place", "delete", "chmod", "mkdir"]
    target: str
    expect: os.stat_result | None
    item: _Item | None = None
    mode: int = 0
    staged: str | None = None  # the staged file or link's name in the staging dir
    dev: int = 0  # the filesystem it is staged on


@dataclass
class _Done:
    """One applied change, and how to put it back."""

    action: Literal["chmod", "made", "made-dir", "moved", "rmdir"]
    target: str
    backup: str = ""  # "moved": the old entry's name in the staging dir
    staging_fd: int = -1
    before: os.stat_result | None = None  # "rmdir", "chmod": the directory as it was


class _HostChanged(Exception):
    pass


class _Ops:
    """The changes ``apply`` makes to the host, one method each (tests make one fail)."""

    def mkdir(self, name: str, mode: int, dir_fd: int) -> None:
        os.mkdir(name, mode, dir_fd=dir_fd)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    def symlink(self, target: str, name: str, dir_fd: int) -> None:
        os.symlink(target, name, dir_fd=dir_fd)

    def rename(self, src: str, dst: str, src_dir_fd: int, dst_dir_fd: int) -> None:
        os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def link(self, src: str, dst: str, src_dir_fd: int, dst_dir_fd: int) -> None:
        os.link(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=False)

    def rmdir(self, name: str, dir_fd: int) -> None:
        os.rmdir(name, dir_fd=dir_fd)

    def chmod(self, name: str, mode: int, dir_fd: int) -> None:
        os.chmod(name, mode, dir_fd=dir_fd, follow_symlinks=False)

    def utime(self, fd: int, ns: tuple[int, int]) -> None:
        os.utime(fd, ns=ns)


_NO_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS)  # a filesystem without


@dataclass
class _Sync:
    """One copy-back: read, plan, stage, apply (or put back). Nothing of ``copy`` changes
    unless all of it succeeded."""

    copy: WorkspaceCopy
    base_fd: int
    tar: tarfile.TarFile
    source: str
    report: SyncReport = field(default_factory=SyncReport)
    baseline: dict[str, Entry] = field(default_factory=dict)
    copies: dict[str, tuple[str, tuple[int, int]]] = field(default_factory=dict)
    steps: list[_Step] = field(default_factory=list)
    chmods: list[_Step] = field(default_factory=list)  # directories' own modes, applied last
    refused: set[str] = field(default_factory=set)
    name_max: int = _NAME_MAX
    _fds: dict[str, int] = field(default_factory=dict)  # open host dirs by path
    _staging: dict[int, tuple[int, str, int]] = field(default_factory=dict)  # st_dev -> fd, name, parent fd
    _counter: int = 0
    _taken: set[str] = field(default_factory=set)  # names this plan creates
    _moved: dict[str, str] = field(default_factory=dict)  # the sandbox's dir -> its conflict copy
    _absent: dict[str, _Item] = field(default_factory=dict)  # the host deleted these dirs

    def go(self, archive: IO[bytes]) -> SyncReport:
        copy = self.copy
        self.baseline = dict(copy.baseline)
        self.copies = dict(copy.copies)
        with contextlib.suppress(OSError, ValueError):
            self.name_max = os.fpathconf(self.base_fd, "PC_NAME_MAX")
        try:
            try:
                sandbox = self.read(archive)
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise CopyBackError(f"the engine's archive of the workspace is malformed or cut "
                                    f"short ({_describe(exc)}); nothing was changed",
                                    base=copy.base, retryable=True, source=self.source) from exc
            content = sum(i.entry.size for i in sandbox.values() if i.entry.kind == "file")
            if content > copy.limit:
                raise CopyLimitError("the sandbox's workspace", copy.limit)
            try:
                self.plan(sandbox)
            except OSError as exc:
                raise CopyBackError(f"looking at the base dir ({_describe(exc)})",
                                    base=copy.base, retryable=True, source=self.source) from exc
            self.run()
        finally:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
        copy.baseline, copy.copies = self.baseline, self.copies
        return self.report

    # --- reading the archive -------------------------------------------------------------
    def read(self, archive: IO[bytes]) -> dict[str, _Item]:
        tar = self.tar
        first = tar.next()
        if first is None or not first.isdir():
            raise CouldNotRunError("the engine's archive of the sandbox's workspace does not "
                                   "start with the workspace directory; nothing was copied "
                                   "back", retryable=True)
        prefix = first.name.rstrip("/") + "/"
        sandbox: dict[str, _Item] = {}
        for member in tar:
            if member is first:
                continue
            inside = member.name.startswith(prefix)
            shown = member.name[len(prefix):] if inside else member.name
            rel = _check_name(shown) if inside else None
            if rel is None or any(len(os.fsencode(p)) > self.name_max for p in rel.split("/")):
                self.report.refused.append(shown)
                continue
            entry = self.copy._entry(tar, member)
            item: _Item | None = _Item(entry, member) if entry is not None else None
            if member.islnk():  # a second name of a file: that file's content, as a file
                target = _check_name(member.linkname.removeprefix(prefix))
                found = sandbox.get(target) if target is not None else None
                if found is not None and found.entry.kind == "file":
                    item = _Item(found.entry, found.member)
            if item is None:  # fifos, devices, sockets, odd links: refused, never "deleted"
                self.report.refused.append(rel)
                self.refused.add(rel)
                sandbox.pop(rel, None)
                continue
            self.refused.discard(rel)
            sandbox[rel] = item
        _check_end(archive, tar.offset)
        return sandbox

    # --- planning ------------------------------------------------------------------------
    def plan(self, sandbox: dict[str, _Item]) -> None:
        """Decide every change from the baseline, the sandbox's tree and the host's now."""
        kept = self.refused
        # the sandbox's deletions first, deepest first: a directory goes when it is empty
        going: set[str] = set()
        for rel in sorted((p for p in self.baseline if p not in sandbox),
                          key=lambda p: p.count("/"), reverse=True):
            if _under(rel, kept):
                continue
            before = self.baseline.pop(rel)
            now = self.lstat(rel)
            if before.host_stamp is None or now is None:
                continue  # an upload the sandbox removed, or gone from both
            if not _unchanged(now, before) or (before.kind == "dir" and not self._empties(rel, going)):
                self.report.conflicts.append(rel)  # the host changed it: the host's stays
                continue
            self.steps.append(_Step("delete", rel, now))
            going.add(rel)
            self.report.deleted.append(rel)
        # then what the sandbox has, parents first
        for rel in sorted(sandbox, key=lambda p: p.split("/")):
            item = sandbox[rel]
            parent, _, name = rel.rpartition("/")
            if parent and (parent not in sandbox or sandbox[parent].entry.kind != "dir"):
                self.report.refused.append(rel)  # below a symlink or a file of the sandbox
                self.refused.add(rel)
                continue
            if _under(rel, kept):
                continue
            if parent in self._moved:  # inside a directory that went to its conflict copy
                known = self.baseline.get(rel)
                if (item.entry.kind == "dir" or known is None or rel not in self.copies
                        or not known.same_content(item.entry)):
                    self.conflict_copy(rel, f"{self._moved[parent]}/{name}", item, inside=True)
                continue
            self.bring(rel, item, going)
        self.steps.extend(reversed(self.chmods))  # deepest first, after everything in them

    def bring(self, rel: str, item: _Item, going: set[str]) -> None:
        entry = item.entry
        before = self.baseline.get(rel)
        now = self.lstat(rel)
        now_kind = _kind(now.st_mode) if now is not None else None
        if now is not None and now_kind == "dir" == entry.kind:
            if before is None or not before.same_content(entry):
                if stat.S_IMODE(now.st_mode) != entry.mode:
                    self.chmods.append(_Step("chmod", rel, now, mode=entry.mode))
                (self.report.modified if before is not None else self.report.added).append(rel)
            self.baseline[rel] = replace(entry, host_stamp=_stamp(now))
            return
        if before is not None and before.same_content(entry) and now_kind in (None, entry.kind):
            if now is None and entry.kind == "dir":
                self._absent[rel] = item  # made again if the sandbox put something new in it
            return  # the sandbox left it as it was (the host may have changed or deleted it)
        if now is not None and self.matches(rel, now, entry):
            self.baseline[rel] = replace(entry, host_stamp=_stamp(now))
            return  # the host already has exactly this
        changed = before is not None and before.host_stamp is not None
        if not changed:
            replaceable = now is None
        else:
            assert before is not None
            replaceable = now is not None and _unchanged(now, before) and (
                now_kind != "dir" or self._empties(rel, going))
        if not replaceable:
            self.conflict_copy(rel, rel, item, inside=False)
            return
        self.place(rel, item, now)
        (self.report.modified if changed else self.report.added).append(rel)
        self.baseline[rel] = entry  # its host_stamp once applied

    def place(self, target: str, item: _Item, now: os.stat_result | None) -> None:
        self.ensure_parent(target)
        if item.entry.kind == "dir":
            if now is not None:  # a file or link the sandbox made a directory
                self.steps.append(_Step("delete", target, now))
            self.steps.append(_Step("mkdir", target, None, item))
            self.chmods.append(_Step("chmod", target, None, mode=item.entry.mode))
        else:
            self.steps.append(_Step("place", target, now, item))
        self._taken.add(target)

    def ensure_parent(self, target: str) -> None:
        """A directory the host deleted while the sandbox put something new in it: made again."""
        parent = target.rpartition("/")[0]
        if parent in self._absent and parent not in self._taken:
            item = self._absent.pop(parent)
            self.place(parent, item, None)
            self.report.added.append(parent)
            self.baseline[parent] = item.entry

    def conflict_copy(self, rel: str, target: str, item: _Item, inside: bool) -> None:
        """The sandbox's version of ``rel`` at a name nobody has: ``NAME.toolseam-conflict``
        beside the host's (numbered past names taken), or this session's earlier copy when
        nobody changed that. Inside a directory's conflict copy, the plain name first."""
        parent, _, name = target.rpartition("/")
        earlier = self.copies.get(rel)
        chosen, now = None, None
        if earlier is not None and earlier[0].rpartition("/")[0] == parent and earlier[0] not in self._taken:
            st = self.lstat(earlier[0])
            if st is not None and _kind(st.st_mode) == item.entry.kind and (
                    item.entry.kind == "dir" or _stamp(st) == earlier[1]):
                chosen, now = earlier[0], st
        number = 0
        while chosen is None:
            number += 1
            first = "" if inside else CONFLICT_SUFFIX
            suffix = first if number == 1 else f"{CONFLICT_SUFFIX}-{number}"
            candidate = fit_name(name, suffix, self.name_max)
            candidate = f"{parent}/{candidate}" if parent else candidate
            if candidate not in self._taken and self.lstat(candidate) is None:
                chosen = candidate
        if item.entry.kind == "dir":
            self._moved[rel] = chosen
            if now is None:
                self.place(chosen, item, None)
                self.report.conflicts.append(rel)
        else:
            self.place(chosen, item, now)
            self.report.conflicts.append(rel)
        self.baseline[rel] = replace(item.entry, host_stamp=None)
        self.copies[rel] = (chosen, earlier[1] if earlier and chosen == earlier[0] else (0, 0))

    def _empties(self, rel: str, going: set[str]) -> bool:
        """True when every entry now in the host's ``rel`` is one the plan deletes."""
        try:
            names = os.listdir(self.dir_fd(rel))
        except OSError:
            return False
        return all(f"{rel}/{n}" in going for n in names)

    def matches(self, rel: str, st: os.stat_result, entry: Entry) -> bool:
        kind = _kind(st.st_mode)
        if kind != entry.kind or (kind != "link" and stat.S_IMODE(st.st_mode) != entry.mode):
            return False
        parent, _, name = rel.rpartition("/")
        if kind == "link":
            return os.readlink(name, dir_fd=self.dir_fd(parent)) == entry.digest
        if kind == "file":
            if st.st_size != entry.size:
                return False
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=self.dir_fd(parent))
            digest = hashlib.sha256()
            with os.fdopen(fd, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
            return digest.hexdigest() == entry.digest
        return True

    # --- the host, below the base dir's descriptor ---------------------------------------
    def dir_fd(self, rel: str) -> int:
        """The host directory ``rel``, every step opened with O_NOFOLLOW (cached)."""
        if not rel:
            return self.base_fd
        if rel not in self._fds:
            parent, _, name = rel.rpartition("/")
            self._fds[rel] = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                     dir_fd=self.dir_fd(parent))
        return self._fds[rel]

    def forget(self, rel: str) -> None:
        """A directory that was removed or replaced: its cached descriptors are stale."""
        for path in [p for p in self._fds if p == rel or p.startswith(rel + "/")]:
            os.close(self._fds.pop(path))

    def lstat(self, rel: str) -> os.stat_result | None:
        parent, _, name = rel.rpartition("/")
        try:
            return os.stat(name, dir_fd=self.dir_fd(parent), follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:  # a symlink on the way: nothing of ours is there
                return None
            raise

    def device(self, parent: str) -> tuple[int, str]:
        """The filesystem ``parent`` is (or will be made) on, and the nearest existing
        directory of ``parent`` and its ancestors."""
        while True:
            st = self.lstat(parent) if parent else os.fstat(self.base_fd)
            if st is not None and stat.S_ISDIR(st.st_mode):
                return st.st_dev, parent
            parent = parent.rpartition("/")[0]

    def staging(self, parent: str) -> tuple[int, int, str]:
        """The staging dir on the filesystem of host dir ``parent`` (one per filesystem, mode
        0700, made at the top of that filesystem below the base dir, so renames from it never
        cross one): its device, its descriptor, and a fresh short name in it — one that fits
        any name limit."""
        dev, where = self.device(parent)
        if dev not in self._staging:
            while where and os.fstat(self.dir_fd(where.rpartition("/")[0])).st_dev == dev:
                where = where.rpartition("/")[0]
            name = f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
            where_fd = os.dup(self.dir_fd(where))  # its own: cached ones close when a dir goes
            try:
                self.copy._ops.mkdir(name, 0o700, where_fd)
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=where_fd)
            except BaseException:
                os.close(where_fd)
                raise
            self._staging[dev] = (fd, name, where_fd)
        self._counter += 1
        return dev, self._staging[dev][0], str(self._counter)

    # --- staging and applying ------------------------------------------------------------
    def run(self) -> None:
        done: list[_Done] = []  # the undo journal
        try:
            try:
                for step in self.steps:
                    if step.action == "place":
                        self.stage(step)
                for step in self.steps:
                    self.apply(step, done)
                made = {s.target for s in self.steps if s.action in ("place", "mkdir")}
                for rel, entry in list(self.baseline.items()):
                    if rel in made and entry.host_stamp is None:
                        st = self.lstat(rel)
                        self.baseline[rel] = replace(entry, host_stamp=_stamp(st) if st else None)
                for rel, (target, _) in list(self.copies.items()):
                    st = self.lstat(target) if target in made else None
                    if st is not None:
                        self.copies[rel] = (target, _stamp(st))
                self.report.bytes_copied = sum(
                    s.item.entry.size for s in self.steps
                    if s.action == "place" and s.item is not None and s.item.entry.kind == "file")
            except _HostChanged as exc:
                self.undo(done, f"the host changed {exc} while the copy-back ran (sync again)",
                          True)
            except (tarfile.TarError, EOFError) as exc:
                self.undo(done, f"the engine's archive is malformed ({_describe(exc)})", True)
            except OSError as exc:
                lasting = (errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.EROFS, errno.EINVAL)
                self.undo(done, f"writing to the host: {_describe(exc)}", exc.errno not in lasting)
            except (OverflowError, ValueError) as exc:
                self.undo(done, f"an entry the host cannot take ({_describe(exc)})", False)
        finally:
            self.clean_staging()

    def stage(self, step: _Step) -> None:
        """Write the sandbox's file or link into the staging dir, mode and time set."""
        assert step.item is not None
        entry, member = step.item.entry, step.item.member
        step.dev, fd, temp = self.staging(step.target.rpartition("/")[0])
        step.staged = temp
        ops = self.copy._ops
        if entry.kind == "link":
            ops.symlink(entry.digest, temp, fd)
            return
        source = self.tar.extractfile(member)
        assert source is not None
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
        try:
            digest = hashlib.sha256()
            while chunk := source.read(_CHUNK):
                digest.update(chunk)
                ops.write(out, chunk)
            if digest.hexdigest() != entry.digest:  # the archive changed under us
                raise tarfile.ReadError(f"the content of {step.target} changed while read")
            os.fchmod(out, entry.mode)
            ns = clamp_mtime_ns(member.mtime)
            try:
                ops.utime(out, (ns, ns))
            except (OverflowError, OSError):  # past what this filesystem stores
                ns = min(ns, _TIME_MAX_NS)
                ops.utime(out, (ns, ns))
        finally:
            os.close(out)

    def apply(self, step: _Step, done: list[_Done]) -> None:
        parent, _, name = step.target.rpartition("/")
        ops = self.copy._ops
        now = self.lstat(step.target)
        if step.action == "chmod":  # a directory: this plan's own, or the one the plan saw
            if now is None or not stat.S_ISDIR(now.st_mode) or (
                    step.expect is not None and not _same_entry(now, step.expect)):
                raise _HostChanged(step.target)
        elif not _same_entry(now, step.expect):
            raise _HostChanged(step.target)
        pfd = self.dir_fd(parent)
        if step.action == "chmod":
            ops.chmod(name, step.mode, pfd)
            done.append(_Done("chmod", step.target, before=now))
        elif step.action == "mkdir":
            ops.mkdir(name, 0o700, pfd)
            done.append(_Done("made-dir", step.target))
        elif step.action == "delete":
            assert now is not None
            self.remove(step.target, now, done)
        else:  # the staged file or link into place
            assert step.staged is not None
            sfd = self._staging[step.dev][0]
            if now is None:
                # link, not rename: a name that appeared meanwhile is never overwritten
                try:
                    ops.link(step.staged, name, sfd, pfd)
                except OSError as exc:
                    if exc.errno == errno.EEXIST:
                        raise _HostChanged(step.target) from exc
                    if exc.errno not in _NO_LINKS:
                        raise
                    ops.rename(step.staged, name, sfd, pfd)
                done.append(_Done("made", step.target))
                return
            if stat.S_ISDIR(now.st_mode):  # the sandbox made a directory a file (emptied before)
                self.remove(step.target, now, done)
            else:  # the replaced entry kept in staging (a second name), the replacement atomic
                _, _, backup = self.staging(parent)
                try:
                    ops.link(name, backup, pfd, sfd)
                except OSError as exc:
                    if exc.errno not in _NO_LINKS:
                        raise
                    self.remove(step.target, now, done)
                else:
                    done.append(_Done("moved", step.target, backup, sfd))
            ops.rename(step.staged, name, sfd, pfd)
            if done[-1].target != step.target or done[-1].action != "moved":
                done.append(_Done("made", step.target))

    def remove(self, target: str, now: os.stat_result, done: list[_Done]) -> None:
        """A directory removed (it is empty: put back by making it again), anything else moved
        into staging (put back by moving it back)."""
        parent, _, name = target.rpartition("/")
        pfd = self.dir_fd(parent)
        ops = self.copy._ops
        if stat.S_ISDIR(now.st_mode):
            self.forget(target)
            try:
                ops.rmdir(name, pfd)
            except OSError as exc:
                if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
                    raise _HostChanged(target) from exc
                raise
            done.append(_Done("rmdir", target, before=now))
        else:
            _, sfd, backup = self.staging(parent)
            ops.rename(name, backup, pfd, sfd)
            done.append(_Done("moved", target, backup, sfd))

    def undo(self, done: list[_Done], what: str, retryable: bool) -> None:
        """Put every applied step back, last first; then raise the one error."""
        failed: list[str] = []
        for step in reversed(done):
            parent, _, name = step.target.rpartition("/")
            try:
                pfd = self.dir_fd(parent)  # afresh: a directory put back is a new one
                if step.action == "chmod":
                    assert step.before is not None
                    os.chmod(name, stat.S_IMODE(step.before.st_mode), dir_fd=pfd,
                             follow_symlinks=False)
                elif step.action == "made-dir":
                    self.forget(step.target)
                    os.rmdir(name, dir_fd=pfd)
                elif step.action == "made":
                    os.unlink(name, dir_fd=pfd)
                elif step.action == "moved":
                    os.rename(step.backup, name, src_dir_fd=step.staging_fd, dst_dir_fd=pfd)
                else:  # rmdir
                    before = step.before
                    assert before is not None
                    os.mkdir(name, 0o700, dir_fd=pfd)
                    with contextlib.suppress(OSError):
                        os.chown(name, before.st_uid, before.st_gid, dir_fd=pfd,
                                 follow_symlinks=False)
                    os.chmod(name, stat.S_IMODE(before.st_mode), dir_fd=pfd)
                    os.utime(name, ns=(before.st_atime_ns, before.st_mtime_ns), dir_fd=pfd)
            except OSError as exc:
                failed.append(f"{step.target} ({_describe(exc)})")
        if failed:
            kept = ", ".join(n for _, n, _p in self._staging.values())
            for fd, _, parent_fd in self._staging.values():
                os.close(fd)
                os.close(parent_fd)
            self._staging.clear()  # kept: they hold what could not go back
            raise CopyBackError(f"{what}; then putting back {'; '.join(failed)} failed (the "
                                f"replaced entries are in {kept})", base=self.copy.base,
                                retryable=False, restored=False, source=self.source)
        raise CopyBackError(what, base=self.copy.base, retryable=retryable, source=self.source)

    def clean_staging(self) -> None:
        for fd, name, parent_fd in self._staging.values():
            with contextlib.suppress(OSError):
                for entry in os.listdir(fd):
                    os.unlink(entry, dir_fd=fd)
                os.rmdir(name, dir_fd=parent_fd)
            os.close(fd)
            os.close(parent_fd)
        self._staging.clear()


def _under(rel: str, names: set[str]) -> bool:
    """``rel`` is one of ``names`` or below one."""
    parts = rel.split("/")
    return any("/".join(parts[:i]) in names for i in range(1, len(parts) + 1))


def _unchanged(now: os.stat_result, before: Entry) -> bool:
    """The host's entry is what it was when last in sync (a directory: still a directory)."""
    kind = _kind(now.st_mode)
    if kind != before.kind:
        return False
    return kind == "dir" or _stamp(now) == before.host_stamp


def _same_entry(now: os.stat_result | None, expect: os.stat_result | None) -> bool:
    """The host's entry is the one the plan saw (a directory's times and size change as the
    copy-back adds and removes entries in it)."""
    if now is None or expect is None:
        return now is expect
    if stat.S_ISDIR(expect.st_mode):
        return (now.st_dev, now.st_ino, now.st_mode) == (expect.st_dev, expect.st_ino, expect.st_mode)
    return (now.st_dev, now.st_ino, now.st_mode, now.st_size, now.st_mtime_ns) == (
        expect.st_dev, expect.st_ino, expect.st_mode, expect.st_size, expect.st_mtime_ns)


def _stamp(st: os.stat_result) -> tuple[int, int]:
    return st.st_size, st.st_mtime_ns


def _kind(mode: int) -> Kind | None:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "file" if stat.S_ISREG(mode) else None


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

