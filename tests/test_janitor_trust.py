"""The janitor trusts nothing it finds in a shared directory (issue 32, attack 4;
docs/security.md): a pool directory counts only when it is a real directory of this user's
under this user's root, and only the mounts below it are detached. Each case runs as root in a
private mount namespace with a tmpfs as the victim."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants as another user: needs root")
ROOT = Path(__file__).resolve().parent.parent


def _plant(case: str) -> dict[str, object]:
    # a shared temp dir of its own: sticky, writable by all, reachable by user nobody
    shared = Path(tempfile.mkdtemp(prefix="toolseam-test-shared-", dir="/tmp"))
    shared.chmod(0o1777)
    try:
        done = _run(case, shared)
    finally:
        shutil.rmtree(shared, ignore_errors=True)  # the namespace (and its mounts) is gone
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _run(case: str, shared: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-m",
         "tests.helpers.plant_pools", case, str(shared)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("case", ["symlink_in_tmp", "symlink_entry", "symlinked_root",
                                  "other_owner", "writable", "group_writable",
                                  "owner_symlink"])
def test_a_planted_pool_directory_unmounts_nothing(case: str) -> None:
    result = _plant(case)
    assert result["mounted"], f"the janitor detached the victim's mount ({case})"
    assert result["swept"] == []


def test_a_dead_pool_of_this_user_is_still_swept() -> None:
    result = _plant("own_dead")
    assert not result["mounted"] and not result["exists"]
    assert len(result["swept"]) == 1  # type: ignore[arg-type]
