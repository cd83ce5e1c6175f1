"""A command in a copied workspace's sandbox that keeps swapping a directory for a link to a
directory outside, while the caller syncs again and again (decision 510): the server packs
the copy below descriptors, so nothing outside ever reaches the caller, and nothing outside
is changed. A real server process on a unix socket hosting the host backend, and podman and
docker, whose container bind-mounts the copy: there the command is root in its container and
the link it plants names a directory of the server's machine it cannot see itself."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from toolseam.backends.remote import HostedSpec, RemoteBackend, UnixTransport
from toolseam.seam.errors import CouldNotRunError
from toolseam.seam.models import PathRef, SpawnRequest

from ..support.engines import IMAGE
from ..support.remote_server import remote_server
from ..support.timing import patience

_OPTIONS: dict[str, dict[str, object]] = {"host": {}, "podman": {"image": IMAGE},
                                          "docker": {"image": IMAGE}}
SECRET = b"outside the workspace 51c0"
SYNCS, SECONDS = 30, 20

# The sandbox's command: as fast as a process can, ``sub`` becomes a link to OUTSIDE and a
# directory again (mv sub sub.d; ln -s OUTSIDE sub; rm sub; mv sub.d sub) from the moment it
# makes ``running`` until ``stop`` appears; it ends with ``sub`` a directory and says how many
# swaps it made (and after each 200, in ``count``).
_SWAPPER = """
import os, sys
outside, swaps = sys.argv[1], 0
open("running", "w").close()
while not os.path.exists("stop"):
    for _ in range(200):
        os.rename("sub", "sub.d"); os.symlink(outside, "sub")
        os.unlink("sub"); os.rename("sub.d", "sub")
        swaps += 1
    with open("count.part", "w") as out:
        out.write(str(swaps))
    os.rename("count.part", "count")
print(swaps)
"""


async def _count(backend: RemoteBackend, ref: PathRef) -> int:
    """The swaps the command had made by its last ``count`` (0 before its first)."""
    if (await backend.stat(ref)).kind == "missing":
        return 0
    return int((await backend.read_bytes(ref)).data.decode())


def _tree(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every name below ``root``, never through a link: its kind and its content or target."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                found[rel] = ("link", os.fsencode(os.readlink(path)))
            elif path.is_dir():
                found[rel] = ("dir", b"")
            else:
                found[rel] = ("file", path.read_bytes())
    return found


@pytest.mark.parametrize("kind", ["host", "podman", "docker"])
async def test_a_link_swapped_in_while_syncing_never_brings_the_outside_home(
        kind: str, tmp_path: Path) -> None:
    base, outside = tmp_path / "base", tmp_path / "outside"
    (base / "sub").mkdir(parents=True)
    for n in range(20):  # a directory worth walking: the swap lands mid-walk often
        (base / "sub" / f"f{n:02}.txt").write_text(f"the caller's own {n}\n")
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    (outside / "nested").mkdir()
    (outside / "nested" / "key").write_bytes(SECRET)
    outside_before = _tree(outside)
    outside_times = {p: os.lstat(outside / p).st_mtime_ns for p in outside_before}
    with remote_server() as server:
        backend = RemoteBackend(transport=UnixTransport(server.directory),
                                hosted=HostedSpec(kind=kind, options=_OPTIONS[kind]),
                                workspace=str(base))
        try:
            info = await backend.open()
            await backend.start(SpawnRequest(
                job="swapper", argv=[sys.executable if kind == "host" else "python3", "-c",
                                     _SWAPPER, str(outside)],
                cwd=info.workspace, env={"PATH": "/usr/bin:/bin"}, wait_ms=0))
            deadline = time.monotonic() + patience(SECONDS)
            running = PathRef(base=info.workspace, path="running")
            while (await backend.stat(running)).kind == "missing":
                assert time.monotonic() < deadline, "the swapper did not start"
                await asyncio.sleep(0.01)
            counted = PathRef(base=info.workspace, path="count")
            before = await _count(backend, counted)
            synced = refused = during = 0
            # SYNCS syncs, and on until the command's count moved meanwhile: a loaded
            # machine may give it no CPU for a while (a rehearsal under a CPU hog did)
            while ((synced + refused < SYNCS or during == 0)
                   and time.monotonic() < deadline):
                try:
                    await backend.sync()
                    synced += 1
                except CouldNotRunError as exc:  # the tree kept changing: said, retryable
                    assert exc.retryable and "changed while" in exc.reason, exc
                    refused += 1
                if during == 0:
                    during = await _count(backend, counted) - before
            await backend.write(PathRef(base=info.workspace, path="stop"), b"")
            ended = await backend.wait("swapper", int(patience(10) * 1000))
            assert ended.exit_code == 0, ended.output
            swaps = int(ended.output.split()[-1])
        finally:
            await backend.close()
    assert backend.copy_back_error is None
    # the syncs raced a live swapper: its count moved between the first sync and the last
    # (what the caller's tree looked like after each sync is no measure: under a CPU hog on
    # both cores every sync of a rehearsal found the same state)
    assert synced >= 1 and during > 0 and swaps >= during, (synced, during, swaps)
    home = _tree(base)
    assert not [p for p, (kind, data) in home.items() if kind == "file" and SECRET in data]
    assert not [p for p in home if p.endswith(("secret.txt", "key"))]
    assert home["sub"] == ("dir", b"")  # the command ended with it a directory again
    assert home["sub/f07.txt"] == ("file", b"the caller's own 7\n")
    assert _tree(outside) == outside_before
    assert {p: os.lstat(outside / p).st_mtime_ns for p in outside_before} == outside_times
