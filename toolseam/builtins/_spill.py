"""Spill files: a command's whole captured output, kept where ``read`` can page it.

When the text a model is shown must be cut to its budget, the whole (captured) output is written
to ``/tmp/toolseam-out-<session>-<random>-<n>-<call>.txt`` inside the sandbox — through the seam's
file part, so the same code serves the host and every container — and the cut's marker names
the file and the line to read on from. ``read`` opens these files even when the session is
confined to its base dir: the session wrote them, they hold nothing the model was not already
owed. The files live as long as the sandbox (a container's /tmp goes with it); the toolkit's
close calls ``remove_spills``, which deletes them (the host's /tmp outlives the session).
"""

from __future__ import annotations

import contextlib
import itertools
import posixpath
import re
import secrets
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..seam.errors import CouldNotRunError, FileOpError
from ..seam.models import ChangeSet, DeleteOp, PathRef, WriteOp
from ..seam.protocol import BuiltinExec

if TYPE_CHECKING:  # _base imports this module: the types only
    from ._base import CallContext, SessionView

SPILL_ROOT = "/tmp"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class _Spills:
    prefix: str  # /tmp/toolseam-out-<session>-<random>-
    files: list[str] = field(default_factory=list)


# Per session object (weak: a dropped session takes its entry with it).
_SESSIONS: weakref.WeakKeyDictionary[SessionView, _Spills] = weakref.WeakKeyDictionary()
_numbers = itertools.count(1)  # call ids may repeat (a client's request ids): names never do


def _spills(services: SessionView, session_id: str) -> _Spills:
    found = _SESSIONS.get(services)
    if found is None:
        # The random part keeps another user of a shared /tmp from preparing the name.
        found = _SESSIONS[services] = _Spills(posixpath.join(
            SPILL_ROOT, f"toolseam-out-{_UNSAFE.sub('_', session_id)[:40]}-"
            f"{secrets.token_hex(8)}-"))
    return found


def is_spill(services: SessionView, absolute_path: str) -> bool:
    """Whether ``absolute_path`` (normalised) is one of this session's spill files."""
    found = _SESSIONS.get(services)
    return found is not None and absolute_path in found.files


def ref_for(ctx: CallContext, path: str | None) -> PathRef:
    """The path as read and grep open it: this session's spill files open even when the session
    is confined to its base dir (exactly those paths; every other one as ``ctx.ref`` has it)."""
    if path and ctx.confine and path.startswith("/"):
        normal = posixpath.normpath(path)
        if is_spill(ctx.services, normal):
            return PathRef(base="/", path=normal, confine=False)
    ref: PathRef = ctx.ref(path)
    return ref


async def spill(backend: BuiltinExec, services: SessionView, session_id: str, call_id: str,
                text: str) -> str | None:
    """Write ``text`` to a new spill file; its path, or None when it could not be written
    (the model is then told the rest was not kept)."""
    spills = _spills(services, session_id)
    path = f"{spills.prefix}{next(_numbers)}-{_UNSAFE.sub('_', call_id)[:60]}.txt"
    try:
        # 0600 and never over an existing file: on the host, /tmp is shared with other users.
        await backend.commit(ChangeSet(base="/", ops=[WriteOp(
            path=path, data=text.encode("utf-8", "replace"), expect="absent", private=True)]))
    except (FileOpError, CouldNotRunError, OSError):
        return None
    spills.files.append(path)
    return path


async def remove_spills(backend: BuiltinExec, services: SessionView) -> None:
    """Delete the session's spill files (call before the backend closes; a container's /tmp
    goes with it anyway, the host's does not)."""
    found = _SESSIONS.pop(services, None)
    if found is None or not found.files:
        return
    with contextlib.suppress(FileOpError, CouldNotRunError, OSError):
        await backend.commit(ChangeSet(base="/", ops=[DeleteOp(path=p) for p in found.files]))
