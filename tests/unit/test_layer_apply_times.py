"""``toolseam_agent/layer.py``'s applier gives a directory the snapshot's very time.

A snapshot's times are whole seconds (each engine's archive makes them so: docker truncates,
podman rounds). The applier once skipped a directory whose time was in the same whole second
as the snapshot's (``int(now) == int(then)``): left at T.6 it read back as T+1 on podman, and
a restore on podman-remote did not give back the snapshot's tree (stop 54's CI,
``test_any_changes_between_two_snapshots_give_the_whole_archives_tree[podman-remote]``)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam_agent import layer

_SECOND = 1_000_000_000
_THEN = 1_796_632_967  # a whole second, as a snapshot stores it


def _archive(where: Path, directory: Path, mtime: int) -> Path:
    """An apply-form archive whose one member is ``directory`` (names are relative to /)."""
    info = tarfile.TarInfo("layer/" + str(directory).lstrip("/"))
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
    plan = json.dumps({"added": [], "changed": [], "deleted": []}).encode()
    header = tarfile.TarInfo("plan.json")
    header.size = len(plan)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(header, io.BytesIO(plan))
        tar.addfile(info)
    path = where / "archive.tar"
    path.write_bytes(buffer.getvalue())
    return path


@settings(max_examples=40, deadline=None)
@given(offset=st.integers(min_value=0, max_value=2 * _SECOND - 1))
def test_a_directory_gets_the_snapshots_exact_time(tmp_path_factory: object, offset: int) -> None:
    where = tmp_path_factory.mktemp("apply")  # type: ignore[attr-defined]
    directory = where / "b"
    directory.mkdir()
    os.utime(directory, ns=(_THEN * _SECOND + offset, _THEN * _SECOND + offset))
    assert layer.apply(str(_archive(where, directory, _THEN))) == 0
    assert os.stat(directory).st_mtime_ns == _THEN * _SECOND
    assert os.stat(directory).st_mode & 0o7777 == 0o755
