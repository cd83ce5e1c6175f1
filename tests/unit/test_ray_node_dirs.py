"""A Ray node actor's staging dirs (issue 39): a session's dir is named after the actor that
owns it, and a starting actor removes the dirs of owners that are gone (a node killed, a
cluster stopped with sessions open) — never a live owner's, never a name it did not make."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from toolseam.ray.node_config import session_root, sweep_dead_roots


def test_dirs_of_dead_owners_go_and_the_rest_stay(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(done.stdout)  # it has exited: no process has that id now (or very rarely)
    dead = tmp_path / f"{dead_pid}-abcdef12-xyz"
    (dead / "workspace").mkdir(parents=True)
    (dead / "workspace" / "f.txt").write_text("left behind")
    live = Path(session_root(str(tmp_path), "0123456789abcdef"))
    assert live.name.startswith(f"{os.getpid()}-01234567-")
    foreign = tmp_path / "not-a-session"
    foreign.mkdir()
    assert sweep_dead_roots(str(tmp_path)) == [dead.name]
    assert not dead.exists() and live.is_dir() and foreign.is_dir()


def test_a_missing_workdir_is_nothing_to_sweep(tmp_path: Path) -> None:
    assert sweep_dead_roots(str(tmp_path / "never-made")) == []


def test_the_default_workdir_is_below_this_users_staging_root() -> None:
    """No ``TOOLSEAM_RAY_WORKDIR``: ``ray`` below the staging root (``staging.user_dir``),
    this user's alone — not a name in the shared temp dir another user could make first."""
    import stat
    import tempfile

    from toolseam.backends.staging import staging_root
    from toolseam.ray.node_config import NodeConfig, own_workdir

    config = NodeConfig.from_env({"TOOLSEAM_RAY_BACKEND": "host"})
    default = Path(own_workdir(config.workdir))
    assert default == staging_root() / "ray"
    assert default.parent != Path(tempfile.gettempdir())
    seen = os.lstat(default)
    assert stat.S_ISDIR(seen.st_mode) and seen.st_uid == os.geteuid()
    assert not seen.st_mode & 0o022
    custom = NodeConfig.from_env({"TOOLSEAM_RAY_BACKEND": "host",
                                  "TOOLSEAM_RAY_WORKDIR": "/srv/ray-stage"})
    assert custom.workdir == "/srv/ray-stage"


def test_a_planted_workdir_is_refused_never_used(tmp_path: Path) -> None:
    """Another local user may make a ``TOOLSEAM_RAY_WORKDIR`` in a shared dir first: the node
    refuses it (and a symlink in its place) instead of keeping workspaces there."""
    import pytest

    from toolseam.backends.staging import UnsafePath
    from toolseam.ray.node_config import own_workdir

    mine = own_workdir(str(tmp_path / "mine"))
    assert (os.stat(mine).st_mode & 0o777) == 0o700
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)  # anyone may write it: not this user's alone
    with pytest.raises(UnsafePath):
        own_workdir(str(planted))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "mine")
    with pytest.raises(UnsafePath):
        own_workdir(str(link))
