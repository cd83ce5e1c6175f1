"""The caller's workspace, copied to the server and back (``RemoteBackend(workspace=PATH)``).

The client packs its base dir at ``open`` (``WorkspaceCopy.pack``: the baseline of the
copy-back rule, ``containers/workspace_sync/tar_sync.py``); the server unpacks it in a private
directory of its spool and hosts the backend on it; ``sync`` and ``close`` bring that
directory back as a tar whose first entry is the workspace itself, which the client applies by
the same copy-back rule a remote engine's copy mode uses (what changed on both sides is kept as
a conflict copy, never overwritten). Nothing here follows a link or unpacks outside its
directory (tarfile's ``data`` filter); the archive is the caller's, the directory the server's.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import tarfile
import tempfile
from typing import Any, cast

from ...seam.errors import CouldNotRunError, HostError
from ...seam.models import SyncReport
from ...seam.protocol import BuiltinExec, WorkspaceTransfer
from ..containers.workspace_sync.tar_sync import WorkspaceCopy
from ..snapshots.tree_tar import TreeTooLargeError
from .codec import MAX_ANSWER
from .workspace import pack

WORKSPACE = "workspace"  # the first entry of a copy-back archive (WorkspaceCopy.apply)
# What an answer carries besides the archive: its tag, pickling, the tar's closing blocks
_ANSWER_ENVELOPE = 64 << 10


# --- the client's side -----------------------------------------------------------------------
def packed(copy: WorkspaceCopy) -> bytes:
    """The base dir as ``open`` carries it (and the copy's baseline, set by packing)."""
    out = io.BytesIO()
    copy.pack(out)
    return out.getvalue()


def applied(copy: WorkspaceCopy, archive: Any, where: str) -> SyncReport:
    """The server's workspace brought home by the copy-back rule."""
    if not isinstance(archive, bytes):
        raise HostError(f"{where} answered a workspace that is not an archive")
    with copy.spool([archive], "the sandbox's workspace") as spool:
        return copy.apply(spool, source=f"the sandbox on {where}")


# --- the server's side -----------------------------------------------------------------------
def unpacked(archive: object, spool: str) -> str:
    """A new private directory of ``spool`` whose ``workspace`` holds the caller's archive;
    the directory (the session's, removed with it by ``removed``)."""
    if not isinstance(archive, bytes):
        raise HostError("open: a workspace is carried as a tar's bytes")
    root = tempfile.mkdtemp(prefix="copied-", dir=spool)
    try:
        workspace = workspace_of(root)
        os.mkdir(workspace, 0o755)
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
            tar.extractall(workspace, filter="data")
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return root


def workspace_of(root: str) -> str:
    return os.path.join(root, WORKSPACE)


def removed(root: str) -> None:
    shutil.rmtree(root, ignore_errors=True)


def _pack_dir(root: str) -> bytes:
    """The copy as one tar in memory, refused by name past what an answer may carry: the
    archive's size is counted as it is packed, and the file that would pass the limit is
    never read (a sandbox's sparse or huge file must not exhaust the server's memory). A
    command in the sandbox may change the directory meanwhile: ``pack`` reads it below
    descriptors, never through a link it swaps in (decision 510)."""
    try:
        return pack(workspace_of(root), WORKSPACE, MAX_ANSWER - _ANSWER_ENVELOPE)
    except TreeTooLargeError as exc:
        raise CouldNotRunError(f"the sandbox's workspace takes {exc.size} bytes or more (at "
                               f"{exc.path!r}), more than a copy home carries ({exc.limit}); "
                               "download what you need", retryable=False,
                               cause="copy_back_failed") from None


async def synced(backend: BuiltinExec, transfers: bool, root: str) -> bytes:
    """``sync`` of a copied session: a backend that declares ``WorkspaceTransfer``
    (``transfers``: a copy-mode container) brings its sandbox's changes to the directory
    first, then the directory goes back whole."""
    if transfers:
        await cast(WorkspaceTransfer, backend).sync()
    return await brought_back(root)


async def brought_back(root: str) -> bytes:
    """What ``close`` answers after the hosted backend's own close (and copy-back) ran."""
    return await asyncio.to_thread(_pack_dir, root)
