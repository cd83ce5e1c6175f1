"""The copy-back rule's parts that judge one entry: its name, its mode, its time, and the
errors a copy fails with (the rule itself: ``tar_sync.py``)."""

from __future__ import annotations

import errno
import os
import tarfile
from dataclasses import dataclass
from typing import IO, Literal

from ....seam.errors import CouldNotRunError

Kind = Literal["file", "dir", "link"]
CONFLICT_SUFFIX = ".toolseam-conflict"
STAGING_PREFIX = ".toolseam-sync-"
DEFAULT_COPY_LIMIT = 2 << 30  # bytes either way; a clear error past it
CHUNK = 1 << 20
NAME_MAX = 255  # when the filesystem does not say
TIME_MAX_NS = (2**31 - 1) * 10**9  # a time every filesystem takes (2038): the fallback clamp


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


def check_name(name: str) -> str | None:
    """The relative path a tar member names, or None when it would leave the base dir."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or name.startswith("/") or ".." in parts or "\x00" in name:
        return None
    return "/".join(parts)


def policy_mode(mode: int, keep_group_write: bool = False) -> int:
    """The permission bits a copy-back gives a file or directory: no setuid, setgid or sticky
    bit ever; group and other write only when asked for."""
    return mode & (0o777 if keep_group_write else 0o755)


def fit_name(name: str, suffix: str, name_max: int = NAME_MAX) -> str:
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


def check_end(archive: IO[bytes], offset: int) -> None:
    """tarfile takes a cut in the stream at a header for the archive's end; the engines'
    archives end with two zero blocks, and without them the rest would read as deleted."""
    archive.seek(offset)
    end = archive.read(2 * tarfile.BLOCKSIZE)
    if len(end) < 2 * tarfile.BLOCKSIZE or end.strip(b"\0"):
        raise tarfile.ReadError(f"no end-of-archive marker at byte {offset}")


def describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where} [{errno.errorcode.get(exc.errno or 0, exc.errno)}]"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
