"""The workspace transfer's two operations whose argument is a path of the client's machine
(``WorkspaceTransfer.upload``, ``download``): the file or directory crosses as a tar, made on
one side and unpacked on the other in a private spool, never followed through a link and never
unpacked outside its spool (tarfile's ``data`` filter)."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

from ...seam.errors import ConfigurationError

ENTRY = "entry"  # the one member name of a transfer's tar


def pack(path: str, arcname: str = ENTRY) -> bytes:
    """``path`` (file or directory; symlinks as links) as a tar of one entry, ``arcname``."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(path, arcname=arcname, recursive=True)
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
