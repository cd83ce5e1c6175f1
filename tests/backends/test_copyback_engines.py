"""The copy-back policy (issue 18) against what real engines hand back: docker and podman in
copy mode on this host, and the two engines in private mount namespaces reached over the
network. Inside, the sandbox tries a setuid copy of /bin/true (the agent's seccomp guard
refuses set-id chmods inside; the copy-back masks them anyway), makes sticky and
world-writable directories and files, a hard link to a host file and FIFOs where a host file
and a host directory were; the host must get none of the bits, lose no file, and be told
what was refused."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from toolseam import Toolkit

from ..support.engines import REMOTE_ENGINES, backend

pytestmark = pytest.mark.slow

PLANT = ("cp /bin/true x && (chmod 4755 x || chmod 755 x) && cp /bin/true g "
         "&& (chmod 2755 g || chmod 755 g) && mkdir sd && (chmod 3777 sd || chmod 1777 sd) "
         "&& echo w > w && chmod 666 w && mkdir ww && chmod 777 ww "
         "&& ln b_orig.txt a_alias.txt && rm pipe.txt && mkfifo pipe.txt "
         "&& rm -r keepdir && mkfifo keepdir && stat -c '%n %a' x g sd w ww")


@pytest.fixture
def base(workspace: Path) -> Path:
    return workspace


def check_host(base: Path) -> None:
    modes = {n: stat.S_IMODE(os.lstat(base / n).st_mode) for n in ("x", "g", "sd", "w", "ww")}
    assert modes == {"x": 0o755, "g": 0o755, "sd": 0o755, "w": 0o644, "ww": 0o755}
    assert all(os.lstat(base / n).st_uid == os.geteuid() for n in modes)
    assert (base / "x").stat().st_size > 0
    assert (base / "b_orig.txt").read_text() == "precious\n"  # the hard link deleted it before
    assert (base / "a_alias.txt").read_text() == "precious\n"
    assert not (base / "a_alias.txt").samefile(base / "b_orig.txt")
    assert (base / "pipe.txt").read_text() == "kept\n"  # a FIFO in its place deleted it before
    assert (base / "keepdir" / "inner.txt").read_text() == "inner\n"
    assert not [n for n in os.listdir(base) if n.startswith(".toolseam-sync-")]


@pytest.mark.parametrize("engine", ["docker", "podman", *REMOTE_ENGINES])
async def test_a_sandbox_plants_no_set_id_bit_and_deletes_no_host_file(engine: str,
                                                                       base: Path) -> None:
    (base / "b_orig.txt").write_text("precious\n")
    (base / "pipe.txt").write_text("kept\n")
    (base / "keepdir").mkdir()
    (base / "keepdir" / "inner.txt").write_text("inner\n")
    made = backend(engine, str(base), workspace_mode="copy")
    async with Toolkit(made) as tk:
        planted = await tk.call("bash", {"command": PLANT, "timeout": 60_000})
        assert not planted.is_error and "w 666" in planted.output, planted.output
        assert "sd 1777" in planted.output or "sd 3777" in planted.output
        report = await tk.sync()
        assert sorted(report.refused) == ["keepdir", "pipe.txt"], report
        assert report.deleted == [] and report.conflicts == []
        assert {"x", "g", "sd", "w", "ww", "a_alias.txt"} <= set(report.added)
        check_host(base)
        # the sandbox goes on; close brings the rest home under the same rule
        more = await tk.call("bash", {"command": "echo again > x2 && chmod 1777 x2 && chmod 777 x",
                                      "timeout": 60_000})
        assert not more.is_error, more.output
    check_host(base)
    assert stat.S_IMODE((base / "x2").stat().st_mode) == 0o755
    assert (base / "x2").read_text() == "again\n"


LIMIT_RUN = """
import asyncio, os, subprocess, sys, tempfile, time
sys.path.insert(0, {root!r})
mnt = {mnt!r}
os.makedirs(mnt, exist_ok=True)
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mnt], check=True)
from tests.support.engines import backend
from toolseam import Toolkit
from toolseam.backends.containers.workspace_sync.tar_sync import CopyLimitError

async def main():
    async with Toolkit(backend({engine!r}, {base!r}, workspace_mode="copy")) as tk:
        made = await tk.call("bash", {{"command": "truncate -s 3G big && echo ok > small",
                                      "timeout": 60000}})
        assert made.output == "", made.output
        tempfile.tempdir = mnt  # the copy-back's spool goes here: 64 MiB, far below the limit
        started = time.monotonic()
        try:
            await tk.sync()
        except CopyLimitError as exc:
            print("REFUSED", round(time.monotonic() - started, 1), exc.reason)
        else:
            print("APPLIED")
        print("HOST", sorted(os.listdir({base!r})))
        tempfile.tempdir = None
        await tk.call("bash", {{"command": "rm big"}})

asyncio.run(main())
"""


@pytest.mark.parametrize("engine", ["docker", "podman", *REMOTE_ENGINES])
def test_a_workspace_past_the_limit_is_refused_on_its_headers(engine: str, base: Path,
                                                               tmp_path: Path) -> None:
    """Issue 18 point 5: the default 2 GiB limit was enforced after ~2.1 GiB had streamed into
    the host's temp dir (6-30 s per refused sync, repeatable by the sandbox). A 3 GiB file
    (sparse in the sandbox, 3 GiB in the engine's archive) is refused on its tar header now:
    the sync runs with its temp dir on a 64 MiB tmpfs (a private mount namespace) and is
    refused quickly, nothing written on the host; before, the spool filled that tmpfs."""
    script = LIMIT_RUN.format(root=str(Path(__file__).parents[2]), mnt=str(tmp_path / "tmp"),
                              engine=engine, base=str(base))
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c",
                           script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    refused, host = done.stdout.splitlines()[:2]
    assert refused.startswith("REFUSED") and "larger than the copy limit" in refused, done.stdout
    assert float(refused.split()[1]) < 10
    assert host == "HOST []"
