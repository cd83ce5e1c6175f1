"""A review of issue 32's fixes as an attacker would try them (each test failed on the code it
reviewed): a search that reads through a name the read scope would refuse, and root's cleanup
of the private staging root another local user can force it into."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from toolseam import ReadQuestion, Settings, Toolkit

from ..support.processes import scratch_root

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="links /etc/shadow, mounts: root")


@dataclass
class Denier:
    asked: list[ReadQuestion] = field(default_factory=list)

    def __call__(self, question: ReadQuestion) -> str:
        self.asked.append(question)
        return "deny"


@pytest.fixture
def root() -> Iterator[Path]:
    base = scratch_root() / uuid.uuid4().hex[:8]
    (base / "work" / "sub").mkdir(parents=True)
    yield base
    shutil.rmtree(base)


def _toolkit(root: Path, approver: Denier) -> Toolkit:
    return Toolkit("host", base_dir=str(root / "work"), approver=approver,  # type: ignore[arg-type]
                   settings=Settings(read_scope="working-dir"),
                   env={"PATH": os.environ["PATH"], "HOME": str(root)})


async def test_a_search_shows_nothing_of_a_hard_link_to_shadow(root: Path) -> None:
    """``read hl`` asks; ``grep root .`` read the same file below an allowed root unasked."""
    approver = Denier()
    async with _toolkit(root, approver) as tk:
        made = await tk.call("bash", {"command": 'B=$PWD; cd /etc && ln shadow "$B/sub/hl"'})
        assert not made.is_error, made.output
        searches = [await tk.call("grep", {"pattern": "^root:"}),
                    await tk.call("grep", {"pattern": "^root:", "path": "sub"}),
                    await tk.call("grep", {"pattern": "^root:", "path": "sub/hl"})]
    assert not any("root:" in r.output for r in searches), [r.output for r in searches]
    assert [q.path for q in approver.asked] == [str(root / "work" / "sub" / "hl")] * 3
    assert "not shown: 1 file the read scope keeps out" in searches[0].model_hints.notes[-1]


async def test_a_search_shows_nothing_of_a_mount_only_the_commands_see(root: Path) -> None:
    """On the host backend a search runs in the agent's mount namespace, the file tools and
    the read scope's check in this process: a command (root) bind-mounts a private directory
    into the base dir, where the check sees an empty directory and the search the secret."""
    private = Path("/opt") / f"toolseam-test-{uuid.uuid4().hex[:8]}"
    private.mkdir()
    (private / "token").write_text("t0ken\n")
    (private / "token").chmod(0o600)
    try:
        approver = Denier()
        async with _toolkit(root, approver) as tk:
            made = await tk.call("bash", {"command": f'mount --bind -o ro "$(printf {private})" '
                                                     "sub && cat sub/token"})
            assert "t0ken" in made.output, made.output  # bash is no boundary: it reads it
            search = await tk.call("grep", {"pattern": "t0k", "path": "sub"})
            everything = await tk.call("grep", {"pattern": "t0k"})
    finally:
        subprocess.run(["umount", "-l", str(root / "work" / "sub")], capture_output=True,
                       check=False)  # there only if the agent had no namespace of its own
        shutil.rmtree(private)
    assert "t0ken" not in search.output and "t0ken" not in everything.output, search.output
    assert "not visible to the read scope's check" in search.model_hints.notes[-1]


_CRASH_WITH_A_POOL = """
    import os, sys, tempfile
    shared, victim = sys.argv[1], sys.argv[2]
    tempfile.tempdir = shared
    os.environ["XDG_CACHE_HOME"] = os.path.join(shared, "no-cache")
    from toolseam.backends import staging
    from toolseam.backends.containers.pool import mounts as pool_mounts
    root = staging.staging_root()
    assert "-private-" in str(root), root  # the shared root was taken first
    pool = pool_mounts.make_pool_dir(pool_mounts.HOST_SLOTS)
    slot = pool_mounts.make_slot(pool, "one")
    pool_mounts.HOST_SLOTS.bind(victim, slot)  # a session's base dir, handed out
    print(root)
    # the process ends with the pool open: an exception, a sys.exit, a signal handled
"""


def test_a_forced_private_staging_root_never_deletes_through_a_pools_mount() -> None:
    """Another user makes ``<tmp>/toolseam-0`` first, so root stages in a private root removed
    at exit; a pool's slot under it has a base dir mounted on it when the process ends."""
    shared = Path(tempfile.mkdtemp(prefix="toolseam-test-shared-", dir="/tmp"))
    shared.chmod(0o1777)
    victim = scratch_root() / f"victim-{uuid.uuid4().hex[:8]}"
    victim.mkdir()
    (victim / "work.txt").write_text("a day's work\n")
    try:
        subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                        "mkdir", "-m", "0755", str(shared / "toolseam-0")], check=True)
        done = subprocess.run(
            ["unshare", "-m", "--propagation", "private", sys.executable, "-c",
             textwrap.dedent(_CRASH_WITH_A_POOL), str(shared), str(victim)],
            capture_output=True, text=True, timeout=60, env={**os.environ,
                                                              "PYTHONPATH": str(REPO)})
        assert done.returncode == 0, done.stderr[-2000:]
        assert (victim / "work.txt").read_text() == "a day's work\n"
    finally:
        shutil.rmtree(shared, ignore_errors=True)  # the namespace and its mounts are gone
        shutil.rmtree(victim, ignore_errors=True)
