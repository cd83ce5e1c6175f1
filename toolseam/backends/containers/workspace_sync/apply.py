"""One copy-back applied all or nothing (``tar_sync.WorkspaceCopy.apply``): read the archive,
plan every change against the baseline (the conflict rule), stage files and links beside the
base dir, apply by renames through ``HostOps``, and put every step back on any failure."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
import tarfile
import uuid
from dataclasses import dataclass, field, replace
from typing import IO, Literal, Protocol

from ....seam.errors import CouldNotRunError
from ....seam.models import SyncReport
from .host_ops import HostOps
from .policy import (
    CHUNK,
    CONFLICT_SUFFIX,
    NAME_MAX,
    STAGING_PREFIX,
    TIME_MAX_NS,
    CopyBackError,
    CopyLimitError,
    Entry,
    Kind,
    check_end,
    check_name,
    clamp_mtime_ns,
    describe,
    fit_name,
)


class CopyBaseline(Protocol):
    """What a copy-back reads of the copy it brings home (``tar_sync.WorkspaceCopy``, which
    makes each ``CopyBack``: declared here so that this module needs nothing of it), and the
    baseline and conflict copies it moves on once all of it succeeded."""

    base: str  # the host's base dir, absolute
    limit: int  # the copy limit in content bytes
    baseline: dict[str, Entry]
    copies: dict[str, tuple[str, tuple[int, int]]]
    host_ops: HostOps  # every change to the host goes through here (tests fail it)

    def entry_of(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> Entry | None: ...


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


_NO_LINKS = (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS)  # a filesystem without


@dataclass
class CopyBack:
    """One copy-back: read, plan, stage, apply (or put back). Nothing of ``copy`` changes
    unless all of it succeeded."""

    copy: CopyBaseline
    base_fd: int
    tar: tarfile.TarFile
    source: str
    report: SyncReport = field(default_factory=SyncReport)
    baseline: dict[str, Entry] = field(default_factory=dict)
    copies: dict[str, tuple[str, tuple[int, int]]] = field(default_factory=dict)
    steps: list[_Step] = field(default_factory=list)
    chmods: list[_Step] = field(default_factory=list)  # directories' own modes, applied last
    refused: set[str] = field(default_factory=set)
    name_max: int = NAME_MAX
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
                                    f"short ({describe(exc)}); nothing was changed",
                                    base=copy.base, retryable=True, source=self.source) from exc
            content = sum(i.entry.size for i in sandbox.values() if i.entry.kind == "file")
            if content > copy.limit:
                raise CopyLimitError("the sandbox's workspace", copy.limit)
            try:
                self.plan(sandbox)
            except OSError as exc:
                raise CopyBackError(f"looking at the base dir ({describe(exc)})",
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
            rel = check_name(shown) if inside else None
            if rel is None or any(len(os.fsencode(p)) > self.name_max for p in rel.split("/")):
                self.report.refused.append(shown)
                continue
            entry = self.copy.entry_of(tar, member)
            item: _Item | None = _Item(entry, member) if entry is not None else None
            if member.islnk():  # a second name of a file: that file's content, as a file
                target = check_name(member.linkname.removeprefix(prefix))
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
        check_end(archive, tar.offset)
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
                while chunk := f.read(CHUNK):
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
                self.copy.host_ops.mkdir(name, 0o700, where_fd)
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
                self.undo(done, f"the engine's archive is malformed ({describe(exc)})", True)
            except OSError as exc:
                lasting = (errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.EROFS, errno.EINVAL)
                self.undo(done, f"writing to the host: {describe(exc)}", exc.errno not in lasting)
            except (OverflowError, ValueError) as exc:
                self.undo(done, f"an entry the host cannot take ({describe(exc)})", False)
        finally:
            self.clean_staging()

    def stage(self, step: _Step) -> None:
        """Write the sandbox's file or link into the staging dir, mode and time set."""
        assert step.item is not None
        entry, member = step.item.entry, step.item.member
        step.dev, fd, temp = self.staging(step.target.rpartition("/")[0])
        step.staged = temp
        ops = self.copy.host_ops
        if entry.kind == "link":
            ops.symlink(entry.digest, temp, fd)
            return
        source = self.tar.extractfile(member)
        assert source is not None
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
        try:
            digest = hashlib.sha256()
            while chunk := source.read(CHUNK):
                digest.update(chunk)
                ops.write(out, chunk)
            if digest.hexdigest() != entry.digest:  # the archive changed under us
                raise tarfile.ReadError(f"the content of {step.target} changed while read")
            os.fchmod(out, entry.mode)
            ns = clamp_mtime_ns(member.mtime)
            try:
                ops.utime(out, (ns, ns))
            except (OverflowError, OSError):  # past what this filesystem stores
                ns = min(ns, TIME_MAX_NS)
                ops.utime(out, (ns, ns))
        finally:
            os.close(out)

    def apply(self, step: _Step, done: list[_Done]) -> None:
        parent, _, name = step.target.rpartition("/")
        ops = self.copy.host_ops
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
        ops = self.copy.host_ops
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
                failed.append(f"{step.target} ({describe(exc)})")
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
