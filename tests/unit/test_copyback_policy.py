"""What the host takes from a sandbox in copy mode (issue 18): the copy-back policy (modes,
special files, hard links, names, times), all or nothing per sync, and the copy limit read
from the tar headers before the bytes. The sandbox is played by crafted archives and by real
directories archived the way an engine's archive API returns a workspace (under
``workspace/``); a full disk is a real tmpfs in a private mount namespace."""

from __future__ import annotations

import errno
import io
import os
import stat
import subprocess
import sys
import tarfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam.backends.containers.workspace_sync.host_ops import HostOps
from toolseam.backends.containers.workspace_sync.policy import (
    CONFLICT_SUFFIX,
    STAGING_PREFIX,
    CopyBackError,
    CopyLimitError,
    fit_name,
)
from toolseam.backends.containers.workspace_sync.tar_sync import WorkspaceCopy
from toolseam.seam.errors import CouldNotRunError

from ..support.copyback import FailingOps, archive_of, started, tree

LONG = "é" * 127 + "x"  # 255 bytes in UTF-8: the longest name Linux takes


def crafted(*entries: tarfile.TarInfo | tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    """An engine's archive of /workspace with exactly these entries (names below it)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        top = tarfile.TarInfo("workspace")
        top.type, top.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(top)
        for item in entries:
            info, data = item if isinstance(item, tuple) else (item, b"")
            info.name = f"workspace/{info.name}"
            if info.type in (tarfile.LNKTYPE,) and info.linkname:
                info.linkname = f"workspace/{info.linkname}"
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data or info.isreg() else None)
    buffer.seek(0)
    return buffer


def member(name: str, kind: bytes = tarfile.REGTYPE, mode: int = 0o644, linkname: str = "",
           mtime: float = 1_700_000_000) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.linkname, info.mtime = kind, mode, linkname, mtime
    return info


@pytest.fixture
def host(tmp_path: Path) -> Path:
    path = tmp_path / "host"
    path.mkdir()
    return path


# --- the policy ---------------------------------------------------------------------------

def test_set_id_sticky_and_group_write_bits_never_come_home(host: Path) -> None:
    """Issue 18 point 1 and 7: ``cp /bin/true x; chmod 4755 x`` in the sandbox gave the host a
    4755 root-owned executable; setgid/sticky directories and 0666/0777 modes came back too."""
    (host / "edit").write_text("old")
    copy = started(host)
    archive = crafted((member("x", mode=0o4755), b"\x7fELF"), (member("g", mode=0o2711), b"g"),
                      member("d", tarfile.DIRTYPE, 0o1777), member("sd", tarfile.DIRTYPE, 0o6775),
                      (member("w", mode=0o666), b"w"), (member("edit", mode=0o6777), b"new"))
    report = copy.apply(archive)
    assert {k: v[:2] for k, v in tree(host).items()} == {
        "x": ("file", 0o755), "g": ("file", 0o711), "d": ("dir", 0o755), "sd": ("dir", 0o755),
        "w": ("file", 0o644), "edit": ("file", 0o755)}
    assert sorted(report.added) == ["d", "g", "sd", "w", "x"] and report.modified == ["edit"]
    assert all(os.lstat(host / n).st_uid == os.geteuid() for n in ("x", "g", "w", "edit"))
    # asked for, group and other write stay; set-id bits never
    other = host.parent / "other"
    other.mkdir()
    kept = started(other, keep_group_write=True)
    kept.apply(crafted((member("w", mode=0o4777), b"w"), member("d", tarfile.DIRTYPE, 0o1777)))
    assert stat.S_IMODE((other / "w").stat().st_mode) == 0o777
    assert stat.S_IMODE((other / "d").stat().st_mode) == 0o777


def test_a_hard_link_in_the_sandbox_deletes_nothing(host: Path, tmp_path: Path) -> None:
    """Issue 18 point 2: ``ln b_orig.txt a_alias.txt`` inside — the archive names a_alias.txt
    first (the data) and b_orig.txt as a hard link to it; b_orig.txt was deleted on the host.
    Decision 38: a second name comes home as a regular file with its target's content."""
    (host / "b_orig.txt").write_text("precious\n")
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    copy = started(host, sandbox)
    os.link(sandbox / "b_orig.txt", sandbox / "a_alias.txt")
    archive = archive_of(sandbox)
    with tarfile.open(fileobj=io.BytesIO(archive.getvalue())) as check:
        assert check.getmember("workspace/b_orig.txt").islnk()  # as the engines give it
    report = copy.apply(archive)
    assert (host / "b_orig.txt").read_text() == "precious\n"
    assert (host / "a_alias.txt").read_text() == "precious\n"
    assert not (host / "a_alias.txt").samefile(host / "b_orig.txt")  # two files, no link
    assert report.added == ["a_alias.txt"] and report.deleted == [] and report.refused == []


def test_special_files_are_refused_and_the_host_keeps_what_they_replaced(host: Path) -> None:
    """Issue 18 point 2: a host file the sandbox replaced with a FIFO was deleted."""
    (host / "pipe.txt").write_text("kept\n")
    (host / "dev").write_text("kept too\n")
    (host / "d").mkdir()
    (host / "d" / "inner.txt").write_text("inside\n")
    (host / "gone.txt").write_text("really deleted\n")
    (host / "b").write_text("b\n")
    copy = started(host)
    archive = crafted(member("pipe.txt", tarfile.FIFOTYPE), member("dev", tarfile.CHRTYPE),
                      member("d", tarfile.FIFOTYPE), member("blk", tarfile.BLKTYPE),
                      (member("b"), b"b\n"),
                      member("h", tarfile.LNKTYPE, linkname="nowhere"),
                      member("h2", tarfile.LNKTYPE, linkname="pipe.txt"))
    report = copy.apply(archive)
    assert sorted(report.refused) == ["blk", "d", "dev", "h", "h2", "pipe.txt"]
    assert report.deleted == ["gone.txt"]
    assert (host / "pipe.txt").read_text() == "kept\n" and (host / "dev").read_text() == "kept too\n"
    assert (host / "d" / "inner.txt").read_text() == "inside\n"
    assert sorted(os.listdir(host)) == ["b", "d", "dev", "pipe.txt"]


# --- names --------------------------------------------------------------------------------

def test_names_of_255_bytes_come_home_whole(host: Path) -> None:
    """Issue 18 point 3: the temporary name was cut by characters, not bytes — OSError after 3
    of 6 files. Temporary names are short now, wherever the file goes."""
    assert len(LONG.encode()) == 255
    copy = started(host)
    names = [f"{i}{LONG[1:]}" for i in range(3)] + [f"d/{LONG}", f"d/{LONG[:-1]}y", LONG]
    assert all(len(n.rpartition("/")[2].encode()) <= 255 for n in names)
    archive = crafted(member("d", tarfile.DIRTYPE, 0o755),
                      *[(member(n), n.encode()) for n in names])
    report = copy.apply(archive)
    assert sorted(report.added) == sorted(["d", *names])
    for name in names:
        assert (host / name).read_bytes() == name.encode()
    assert not [n for n in os.listdir(host) if n.startswith(STAGING_PREFIX)]


def test_a_conflict_on_a_255_byte_name_fits_and_never_overwrites(host: Path) -> None:
    """A conflict copy's name fits the byte limit (cut by bytes, whole characters), and an
    existing ``NAME.toolseam-conflict`` is never overwritten: the copies are numbered."""
    (host / LONG).write_text("base")
    (host / "a.txt").write_text("base")
    copy = started(host)
    (host / LONG).write_text("host edit")
    (host / "a.txt").write_text("host edit")
    (host / ("a.txt" + CONFLICT_SUFFIX)).write_text("the user's own file of that name")
    report = copy.apply(crafted((member(LONG), b"sandbox 1"), (member("a.txt"), b"sandbox 1")))
    assert sorted(report.conflicts) == sorted([LONG, "a.txt"])
    assert (host / "a.txt").read_text() == "host edit"
    assert (host / ("a.txt" + CONFLICT_SUFFIX)).read_text() == "the user's own file of that name"
    assert (host / f"a.txt{CONFLICT_SUFFIX}-2").read_text() == "sandbox 1"
    long_copy = fit_name(LONG, CONFLICT_SUFFIX)
    assert len(long_copy.encode()) <= 255 and long_copy.endswith(CONFLICT_SUFFIX)
    long_copy.encode("utf-8")  # whole characters: a split one would not encode
    assert (host / long_copy).read_text() == "sandbox 1" and (host / LONG).read_text() == "host edit"
    # the sandbox edits again: its own earlier copy is replaced, no third file
    report = copy.apply(crafted((member(LONG), b"sandbox 2"), (member("a.txt"), b"sandbox 2")))
    assert (host / f"a.txt{CONFLICT_SUFFIX}-2").read_text() == "sandbox 2"
    assert not (host / f"a.txt{CONFLICT_SUFFIX}-3").exists()
    # once the user touched that copy, it is theirs: the next one is numbered past it
    (host / f"a.txt{CONFLICT_SUFFIX}-2").write_text("user kept this")
    copy.apply(crafted((member(LONG), b"sandbox 3"), (member("a.txt"), b"sandbox 3")))
    assert (host / f"a.txt{CONFLICT_SUFFIX}-2").read_text() == "user kept this"
    assert (host / f"a.txt{CONFLICT_SUFFIX}-3").read_text() == "sandbox 3"


@pytest.mark.parametrize(("name", "suffix", "limit"), [
    ("é" * 127 + "x", ".toolseam-conflict-12", 255), ("ab" + "€" * 84, ".c", 255),
    ("a" * 300, ".s", 255), ("日本語" * 20, ".toolseam-conflict", 30), ("short", ".s", 255)])
def test_fit_name_cuts_by_bytes_on_character_boundaries(name: str, suffix: str, limit: int) -> None:
    fitted = fit_name(name, suffix, limit)
    raw = fitted.encode()
    assert len(raw) <= limit and fitted.endswith(suffix)
    assert name.startswith(fitted[:-len(suffix)])
    assert len(raw) > limit - 4 or fitted == name + suffix  # no more than one character lost


# --- times ----------------------------------------------------------------------------------

@pytest.mark.parametrize("mtime", [2**63 - 1, 2**40, -5, 1e30, 1_700_000_000.123456789])
def test_times_are_clamped_to_what_the_host_takes(host: Path, mtime: float) -> None:
    """Issue 18 point 3: mtime 2^63-1 made ``os.utime`` raise OverflowError half-way."""
    copy = started(host)
    report = copy.apply(crafted((member("a.txt"), b"a"), (member("t.txt", mtime=mtime), b"t"),
                                (member("z.txt"), b"z")))
    assert sorted(report.added) == ["a.txt", "t.txt", "z.txt"]
    assert (host / "t.txt").read_bytes() == b"t"
    assert (host / "t.txt").stat().st_mtime_ns >= 0


# --- all or nothing ----------------------------------------------------------------------


def busy_host(host: Path, sandbox: Path) -> WorkspaceCopy:
    """Twelve changes of every kind between host and sandbox."""
    for i in range(4):
        (host / f"edit{i}.txt").write_text(f"old {i}\n")
    (host / "gone.txt").write_text("bye\n")
    (host / "old").mkdir()
    (host / "old" / "f").write_text("f\n")
    (host / "link").symlink_to("edit0.txt")
    (host / "becomes-dir").write_text("file\n")
    copy = started(host, sandbox)
    for i in range(4):
        (sandbox / f"edit{i}.txt").write_text(f"new {i}\n" * 100)
    (sandbox / "gone.txt").unlink()
    (sandbox / "old" / "f").unlink()
    (sandbox / "old").rmdir()
    (sandbox / "link").unlink()
    (sandbox / "link").symlink_to("edit1.txt")
    (sandbox / "becomes-dir").unlink()
    (sandbox / "becomes-dir").mkdir(mode=0o700)
    (sandbox / "becomes-dir" / "in").write_text("in\n")
    (sandbox / "new" / "deep").mkdir(parents=True)
    (sandbox / "new" / "deep" / "x.sh").write_text("#!/bin/sh\n")
    (sandbox / "new" / "deep" / "x.sh").chmod(0o4755)
    (sandbox / "edit3.txt").chmod(0o600)
    return copy


def test_a_failure_at_any_step_leaves_the_host_exactly_as_it_was(tmp_path: Path) -> None:
    """Issue 18 point 3: the disk filling during copy-back left 7 of 12 files applied and a raw
    OSError. Every change is staged first and put back on failure: whichever step fails (a
    full disk, an I/O error, a name too long), the host tree is what it was, nothing of the
    staging is left, one CopyBackError says so — and the next sync brings everything home."""
    failures = 0
    at = 1
    while True:
        root = tmp_path / str(at)
        host, sandbox = root / "host", root / "sandbox"
        host.mkdir(parents=True)
        sandbox.mkdir()
        copy = busy_host(host, sandbox)
        before, baseline = tree(host), dict(copy.baseline)
        stamps = {p: os.lstat(host / p).st_mtime_ns for p in before if before[p][0] == "file"}
        code = (errno.ENOSPC, errno.EIO, errno.ENAMETOOLONG)[at % 3]
        failing = copy.host_ops = FailingOps(at, code)
        archive = archive_of(sandbox)
        fds = len(os.listdir("/proc/self/fd"))
        try:
            report = copy.apply(archive)
        except CopyBackError as exc:
            assert len(os.listdir("/proc/self/fd")) == fds  # no descriptor left open
            failures += 1
            assert tree(host) == before, at
            assert {p: os.lstat(host / p).st_mtime_ns for p in stamps} == stamps
            assert copy.baseline == baseline
            assert os.strerror(code) in exc.reason and "left exactly as it was" in exc.reason
            assert "still in the sandbox" in exc.reason
            assert exc.retryable == (code != errno.ENAMETOOLONG)
            copy.host_ops = HostOps()
            report = copy.apply(archive_of(sandbox))  # the disk has room again
        else:  # past the last step, or a time this filesystem refused (set clamped instead)
            assert failing.calls < at or failing.failed_in == "utime"
        expected = tree(sandbox)
        expected["new/deep/x.sh"] = ("file", 0o755, expected["new/deep/x.sh"][2])
        assert tree(host) == expected and report.conflicts == []
        if failing.calls < at:
            break
        at += 1
    assert failures >= 20  # every step was tried


def test_a_host_disk_that_fills_up_leaves_the_tree_unchanged(tmp_path: Path) -> None:
    """The same with a real full disk: the base dir on a 1 MiB tmpfs mounted in a private mount
    namespace (nothing outside sees it)."""
    script = textwrap.dedent(f"""
        import io, os, subprocess, sys, tarfile
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from tests.support.copyback import tree, archive_of, started
        from toolseam.backends.containers.workspace_sync.policy import CopyBackError
        mnt = {str(tmp_path / "mnt")!r}
        os.makedirs(mnt)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", mnt], check=True)
        host, sandbox = os.path.join(mnt, "host"), {str(tmp_path / "sandbox")!r}
        os.makedirs(host); os.makedirs(sandbox)
        for i in range(12):
            with open(os.path.join(host, f"f{{i:02}}"), "w") as f: f.write("host\\n")
        copy = started(__import__("pathlib").Path(host), __import__("pathlib").Path(sandbox))
        for i in range(12):
            with open(os.path.join(sandbox, f"f{{i:02}}"), "wb") as f: f.write(os.urandom(150_000))
        before = tree(__import__("pathlib").Path(host))
        try:
            copy.apply(archive_of(__import__("pathlib").Path(sandbox)))
        except CopyBackError as exc:
            assert "No space left on device" in exc.reason, exc.reason
            assert tree(__import__("pathlib").Path(host)) == before
            print("UNCHANGED", exc.retryable)
        else:
            print("APPLIED")
    """)
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                           script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["UNCHANGED", "True"]


def test_an_archive_cut_short_changes_nothing(host: Path, tmp_path: Path) -> None:
    """A stream the engine cut (the raw tarfile.ReadError seen during builds): inside a file's
    data it was a raw exception; at a header, tarfile took the cut for the archive's end and
    every file after it read as deleted by the sandbox."""
    for name in "abcdef":
        (host / f"{name}.txt").write_text(name * 2000)
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    copy = started(host, sandbox)
    (sandbox / "a.txt").write_text("changed")
    whole = archive_of(sandbox).getvalue()
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        offsets = [m.offset for m in tar.getmembers()[3:]] + [tar.getmembers()[4].offset_data + 700]
    before = tree(host)
    for cut in offsets:
        with pytest.raises(CopyBackError, match="malformed or cut short") as caught:
            copy.apply(io.BytesIO(whole[:cut]))
        assert caught.value.retryable and tree(host) == before
        with pytest.raises(CopyBackError, match="reading the sandbox's workspace") as spooled:
            copy.spool(iter([whole[:cut]]), "the sandbox's workspace")
        assert spooled.value.retryable
    garbage = whole[:offsets[1]] + b"\x01" * 512 + whole[offsets[1] + 512:]
    with pytest.raises(CopyBackError):
        copy.apply(io.BytesIO(garbage))
    assert tree(host) == before
    copy.apply(io.BytesIO(whole))
    assert (host / "a.txt").read_text() == "changed" and len(os.listdir(host)) == 6


# --- the limit before the bytes ---------------------------------------------------------

def stream(files: list[tuple[str, int]], pulled: list[int]) -> Iterator[bytes]:
    """An engine's archive, made as it is read: headers and zero data, 1 MiB chunks; counts
    the bytes the reader pulled."""
    def block(info: tarfile.TarInfo) -> bytes:
        return info.tobuf(tarfile.PAX_FORMAT)
    top = tarfile.TarInfo("workspace")
    top.type = tarfile.DIRTYPE
    pulled.append(len(block(top)))
    yield block(top)
    for name, size in files:
        info = tarfile.TarInfo(f"workspace/{name}")
        info.size = size
        pulled[0] += 512
        yield block(info)
        left = size + (-size % 512)
        while left:
            chunk = min(left, 1 << 20)
            pulled[0] += chunk
            yield bytes(chunk)
            left -= chunk
    yield bytes(1024)


@pytest.mark.parametrize("files", [[("huge.bin", 8 << 30)], [(f"f{i}", 1 << 20) for i in range(40)]])
def test_the_copy_limit_is_read_from_the_headers_before_the_bytes(host: Path,
                                                                  files: list[tuple[str, int]]) -> None:
    """Issue 18 point 5: the limit was enforced after ~2.1 GiB had been streamed into the temp
    dir. Now a sandbox with 8 GiB (or 40 MiB in small files) past a 10 MiB limit costs about
    the limit: refused on the header that passes it."""
    copy = started(host)
    copy.limit = 10 << 20
    pulled: list[int] = []
    t0 = time.monotonic()
    with pytest.raises(CopyLimitError, match="larger than the copy limit of 10485760 bytes"):
        copy.spool(stream(files, pulled), "the sandbox's workspace")
    assert time.monotonic() - t0 < 5
    assert pulled[0] <= (10 << 20) + (2 << 20), pulled
    assert os.listdir(host) == []


def test_a_workspace_within_the_limit_spools_and_applies(host: Path) -> None:
    copy = started(host)
    copy.limit = 10 << 20
    pulled: list[int] = []
    with copy.spool(stream([("a.bin", 3 << 20), ("b.bin", 5)], pulled), "w") as spool:
        report = copy.apply(spool)
    assert sorted(report.added) == ["a.bin", "b.bin"] and (host / "a.bin").stat().st_size == 3 << 20


def test_the_error_types_stay_in_the_could_not_run_family() -> None:
    assert issubclass(CopyBackError, CouldNotRunError) and issubclass(CopyLimitError, CouldNotRunError)


# --- directories in conflicts, and the host changing meanwhile ---------------------------

def test_a_directory_that_conflicts_comes_home_as_its_conflict_copy(host: Path, tmp_path: Path) -> None:
    """The host changed file ``a`` while the sandbox made ``a`` a directory with files: the
    host's file stays, the sandbox's directory and everything in it go to
    ``a.toolseam-conflict``; a directory the host deleted while the sandbox added to it is made
    again for the new file."""
    (host / "a").write_text("base")
    (host / "d").mkdir()
    (host / "d" / "old").write_text("old")
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    copy = started(host, sandbox)
    (host / "a").write_text("host edit")
    (host / "d" / "old").unlink()
    (host / "d").rmdir()
    (sandbox / "a").unlink()
    (sandbox / "a" / "sub").mkdir(parents=True)
    (sandbox / "a" / "sub" / "f.txt").write_text("sandbox work")
    (sandbox / "d" / "new").write_text("new")
    report = copy.apply(archive_of(sandbox))
    assert (host / "a").read_text() == "host edit"
    assert (host / f"a{CONFLICT_SUFFIX}" / "sub" / "f.txt").read_text() == "sandbox work"
    assert (host / "d" / "new").read_text() == "new" and not (host / "d" / "old").exists()
    assert sorted(report.conflicts) == ["a", "a/sub", "a/sub/f.txt"]
    assert sorted(report.added) == ["d", "d/new"]
    # the sandbox works on: its later file lands in the same conflict copy
    (sandbox / "a" / "sub" / "g.txt").write_text("more")
    copy.apply(archive_of(sandbox))
    assert (host / f"a{CONFLICT_SUFFIX}" / "sub" / "g.txt").read_text() == "more"
    assert not (host / f"a{CONFLICT_SUFFIX}-2").exists()


class RacingOps(HostOps):
    """The host user edits a file right after the copy-back has staged its changes."""

    def __init__(self, path: Path) -> None:
        self.path, self.done = path, False

    def race(self) -> None:
        if not self.done:
            self.done = True
            self.path.write_text("the host's edit, meanwhile")

    def rename(self, src: str, dst: str, src_dir_fd: int, dst_dir_fd: int) -> None:
        self.race()
        super().rename(src, dst, src_dir_fd, dst_dir_fd)

    def link(self, src: str, dst: str, src_dir_fd: int, dst_dir_fd: int) -> None:
        self.race()
        super().link(src, dst, src_dir_fd, dst_dir_fd)


def test_a_host_edit_during_the_copy_back_is_never_overwritten(host: Path, tmp_path: Path) -> None:
    (host / "a.txt").write_text("a")
    (host / "z.txt").write_text("z")
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    copy = started(host, sandbox)
    (sandbox / "a.txt").write_text("sandbox a")
    (sandbox / "z.txt").write_text("sandbox z")
    copy.host_ops = RacingOps(host / "z.txt")
    with pytest.raises(CopyBackError, match=r"the host changed z\.txt while the copy-back ran") as caught:
        copy.apply(archive_of(sandbox))
    assert caught.value.retryable
    assert (host / "a.txt").read_text() == "a"
    assert (host / "z.txt").read_text() == "the host's edit, meanwhile"
    copy.host_ops = HostOps()
    report = copy.apply(archive_of(sandbox))  # the retry: now a conflict, both kept
    assert report.modified == ["a.txt"] and report.conflicts == ["z.txt"]
    assert (host / f"z.txt{CONFLICT_SUFFIX}").read_text() == "sandbox z"


def test_the_hosts_own_modes_stay_when_the_sandbox_left_the_file_alone(host: Path,
                                                                      tmp_path: Path) -> None:
    """The policy is for what the sandbox hands back: a host file that is group-writable (or
    set-id, by its owner's choice) keeps its mode while the sandbox does not change it; a
    staging dir a killed copy-back left is never sent into a sandbox."""
    (host / "shared.txt").write_text("team\n")
    (host / "shared.txt").chmod(0o664)
    (host / "tool").write_text("#!/bin/sh\n")
    (host / "tool").chmod(0o4755)
    (host / f"{STAGING_PREFIX}0123456789ab").mkdir()
    (host / f"{STAGING_PREFIX}0123456789ab" / "1").write_text("left by a crash")
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    copy = started(host, sandbox)
    assert sorted(os.listdir(sandbox)) == ["shared.txt", "tool"]
    (sandbox / "new.txt").write_text("new\n")
    report = copy.apply(archive_of(sandbox))
    assert report.added == ["new.txt"] and report.modified == [] and report.deleted == []
    assert stat.S_IMODE((host / "shared.txt").stat().st_mode) == 0o664
    assert stat.S_IMODE((host / "tool").stat().st_mode) == 0o4755
    (sandbox / "tool").write_text("#!/bin/sh\necho changed\n")
    assert copy.apply(archive_of(sandbox)).modified == ["tool"]
    assert stat.S_IMODE((host / "tool").stat().st_mode) == 0o755  # what came back is masked
