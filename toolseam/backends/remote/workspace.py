"""The workspace transfer's two operations whose argument is a path of the client's machine
(``WorkspaceTransfer.upload``, ``download``): the file or directory crosses as a tar, made on
one side and unpacked on the other in a private spool, never followed through a link and never
unpacked outside its spool (tarfile's ``data`` filter).

Every tar here is made by ``pack``, descriptor-relatively (``snapshots/tree_tar.py``), because
one of them is read while a sandbox may change it: the server's copy of a caller's workspace
(``copied.py``), bind-mounted into a container or the host kind's working directory while a
``sync`` packs it (decision 510). The two others could not race with a sandbox even by path:
``upload_args`` packs a path of the caller's machine, which no sandbox of this session sees;
``download_here`` packs the server's private spool only after the hosted backend's
``download`` copied into it — no sandbox can reach the spool (a container sees its own mounts
only; a host-kind command could, but runs as the server's user and can read what it likes
anyway: the host backend is no boundary against its own user)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

from ...seam.errors import ConfigurationError
from ..snapshots.capture import TreeChangedError
from ..snapshots.tree_tar import pack_tree

ENTRY = "entry"  # the one member name of a transfer's tar
_TRIES = 3  # packs of a tree a command keeps changing before its TreeChangedError is the answer


def pack(path: str, arcname: str = ENTRY, limit: int | None = None) -> bytes:
    """``path`` (file or directory; symlinks as links) as a tar of one entry, ``arcname``;
    past ``limit`` bytes, ``TreeTooLargeError`` before the file that passes it is read. A tree
    a command keeps changing is packed again, ``_TRIES`` times in all."""
    for _ in range(_TRIES - 1):
        with contextlib.suppress(TreeChangedError):
            return _packed(path, arcname, limit)
    return _packed(path, arcname, limit)


def _packed(path: str, arcname: str, limit: int | None) -> bytes:
    out = io.BytesIO()
    pack_tree(path, arcname, out, limit)
    return out.getvalue()


def unpack(archive: bytes, spool: str) -> str:
    """The tar's entry unpacked in ``spool``; its path."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        tar.extractall(spool, filter="data")
    found = os.path.join(spool, ENTRY)
    if not os.path.lexists(found):
        raise ConfigurationError("a workspace transfer's archive holds no entry")
    return found


# --- the client's side -----------------------------------------------------------------------
def exists(path: str) -> bool:
    return os.path.lexists(path)


async def upload_args(local: str, dest: str) -> tuple[bytes, str]:
    if not os.path.lexists(local):
        raise ConfigurationError(f"upload: {local} does not exist")
    return await asyncio.to_thread(pack, local), dest


async def download_result(archive: bytes, local: str) -> None:
    """Put the downloaded entry at ``local`` (whose absence was checked before the call)."""
    parent = os.path.dirname(os.path.abspath(local))

    def place() -> None:
        with tempfile.TemporaryDirectory(dir=parent) as spool:
            shutil.move(unpack(archive, spool), local)

    await asyncio.to_thread(place)


# --- the server's side -----------------------------------------------------------------------
async def upload_here(upload: Callable[[str, str], Awaitable[None]], spool_root: str,
                      archive: bytes, dest: str) -> None:
    with tempfile.TemporaryDirectory(dir=spool_root) as spool:
        local = await asyncio.to_thread(unpack, archive, spool)
        await upload(local, dest)


async def download_here(download: Callable[[str, str], Awaitable[None]], spool_root: str,
                        src: str) -> Any:
    with tempfile.TemporaryDirectory(dir=spool_root) as spool:
        local = os.path.join(spool, ENTRY)
        await download(src, local)
        return await asyncio.to_thread(pack, local)
