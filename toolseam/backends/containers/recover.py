"""The work a failed copy-back kept, listed, copied out, removed (``toolseam recover``:
``frontends/recover.py``).

When close cannot bring a copy-mode sandbox's changes home, the container and its workspace
volume are kept and marked (``sandbox.KEPT_*``); the janitor leaves them for
``KEPT_RETENTION_S``. This copies the kept ``/workspace`` out through the engine's archive
API (it reads a stopped container) into a new directory — never over the base dir, whose
state the failed copy-back left as it was — by the same rule as every copy-back: regular
files, directories and symlinks that stay inside; no set-id, sticky or group/other write
bits; owned by whoever runs this. ``tarfile``'s ``data`` filter enforces exactly that; an
entry it refuses is reported and skipped, not fatal.
"""

from __future__ import annotations

import os
import tarfile
import tempfile
import time
from dataclasses import dataclass
from typing import IO

from ...seam.errors import ConfigurationError
from .engine.protocol import Engine
from .labels import (
    KEPT_CONTAINER_LABEL,
    KEPT_LABEL,
    KEPT_RETENTION_S,
    KEPT_VOLUME_LABEL,
    KEPT_WORKSPACE_LABEL,
    SESSION_LABEL,
    WORKSPACE,
)


@dataclass(frozen=True)
class Kept:
    container: str
    volume: str
    marker: str
    session: str
    kept_at: float
    workspace: str  # the host dir the work was going to

    def line(self) -> str:
        at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.kept_at))
        until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.kept_at + KEPT_RETENTION_S))
        return f"{self.container[:12]}\tkept {at}\tuntil {until}\tfor {self.workspace}"


def kept(engine: Engine) -> list[Kept]:
    found = []
    for marker, labels in engine.labeled_volumes(KEPT_LABEL):
        try:
            at = float(labels.get(KEPT_LABEL, ""))
        except ValueError:
            at = 0.0
        found.append(Kept(labels.get(KEPT_CONTAINER_LABEL, ""), labels.get(KEPT_VOLUME_LABEL, ""),
                          marker, labels.get(SESSION_LABEL, ""), at,
                          labels.get(KEPT_WORKSPACE_LABEL, "")))
    return sorted(found, key=lambda k: k.kept_at)


def find(engine: Engine, name: str) -> Kept:
    """The kept sandbox ``name`` names: its container id (or a prefix) or container name."""
    matches = [k for k in kept(engine) if name and (
        k.container.startswith(name) or name == f"toolseam-{k.session}")]
    if len(matches) != 1:
        what = "no kept sandbox" if not matches else "more than one kept sandbox"
        raise ConfigurationError(f"{what} matches {name!r} on the engine at {engine.endpoint} "
                                 "('toolseam recover --list' shows them)")
    return matches[0]


def copy_out(engine: Engine, item: Kept, dest: str) -> list[str]:
    """The kept workspace as the new directory ``dest`` (staged beside it, then renamed, so
    ``dest`` appears whole or not at all). Returns the entries refused."""
    dest = os.path.abspath(dest)
    if os.path.lexists(dest):
        raise ConfigurationError(f"recover: {dest} already exists (name a new directory)")
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        raise ConfigurationError(f"recover: {parent} is not a directory")
    refused: list[str] = []
    with tempfile.TemporaryDirectory(prefix=".toolseam-recover-", dir=parent) as stage:
        target = os.path.join(stage, "workspace")
        os.mkdir(target, 0o755)
        with engine.get_archive(item.container, WORKSPACE) as chunks, \
                tempfile.TemporaryFile(prefix="toolseam-recover-") as spool:
            for chunk in chunks:
                spool.write(chunk)
            spool.seek(0)
            _extract(spool, target, refused)
        os.rename(target, dest)
    return refused


def _extract(spool: IO[bytes], target: str, refused: list[str]) -> None:
    """Below the archive's first entry (the workspace directory itself: ``workspace/…`` from
    docker and a running podman, ``/…`` below ``""`` from a stopped podman), into ``target``."""
    with tarfile.open(fileobj=spool) as tar:
        members = iter(tar)
        first = next(members, None)
        if first is None or not first.isdir():
            raise ConfigurationError("recover: the engine's archive does not start with the "
                                     "workspace directory")
        prefix = first.name.rstrip("/") + "/"

        def policy(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
            rel = member.name[len(prefix):].strip("/") if member.name.startswith(prefix) else ""
            if not rel:
                refused.append(member.name)
                return None
            # a hard link names another archive entry
            link = member.linkname.removeprefix(prefix).lstrip("/") if member.islnk() \
                else member.linkname
            try:
                return tarfile.data_filter(member.replace(name=rel, linkname=link), path)
            except tarfile.FilterError:
                refused.append(rel)
                return None

        tar.extractall(target, members=[m for m in tar.getmembers() if m is not first],
                       filter=policy)


def remove(engine: Engine, item: Kept) -> None:
    """The kept container, its workspace volume and its marker, gone."""
    if item.container:
        engine.remove(item.container)
    if item.volume:
        engine.remove_volume(item.volume)
    engine.remove_volume(item.marker)
