"""Root's janitor trusts nothing it finds in a shared directory (issue 32, attack 4).

The attack, as reproduced on the old code: user ``nobody`` plants ``<tmp>/toolseam-pool-x ->
/dev/shm`` and ``/dev/shm/owner`` naming a dead process; root's next container session runs
the janitor, which followed the link and detached every mount below ``/dev/shm``. Each test
runs the sweep as root in a private mount namespace of its own, with a tmpfs standing in for
the victim mount, and looks at the mount afterwards.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from toolseam.backends.staging import user_dir

REPO = Path(__file__).resolve().parents[2]
DEAD_OWNER = f"{os.uname().nodename}:4194303:1.000"  # pid_max's last pid, a start time of 1 s

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the janitor's mounts need root")


def _in_private_namespace(script: str) -> str:
    """``script`` (Python) run as root in a private mount namespace; its stdout."""
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c",
         textwrap.dedent(script)], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


_SWEEP_AND_LOOK = """
    import os, subprocess, sys
    victim = sys.argv[1] if len(sys.argv) > 1 else VICTIM
    from toolseam.backends.containers.pool.mounts import sweep_dead_pools
    from toolseam.backends.containers.janitor import sweep_socket_dirs
    sweep_dead_pools(); sweep_socket_dirs()
    mounted = any(line.split()[4] == victim for line in open("/proc/self/mountinfo"))
    print("MOUNTED" if mounted else "GONE", sorted(os.listdir(victim)))
"""


def _victim(tmp: Path) -> str:
    """A directory another user can reach (pytest's own temp dirs are root's alone)."""
    victim = Path("/tmp") / f"toolseam-test-victim-{uuid.uuid4().hex[:8]}"
    victim.mkdir(mode=0o755)
    return str(victim)


def _as_nobody(argv: list[str]) -> None:
    subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv],
                   check=True, timeout=30)


def test_a_planted_link_in_the_temp_dir_is_never_followed(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    planted = Path(os.environ.get("TMPDIR", "/tmp")) / f"toolseam-pool-{uuid.uuid4().hex[:8]}"
    script = f"""
    import os, subprocess
    VICTIM = {victim!r}
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", VICTIM], check=True)
    os.chmod(VICTIM, 0o1777)
    subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                    "sh", "-c", "echo {DEAD_OWNER} > {victim}/owner; ln -s {victim} {planted}"],
                   check=True)
    """ + _SWEEP_AND_LOOK
    try:
        out = _in_private_namespace(script)
    finally:
        if planted.is_symlink():
            planted.unlink()
        shutil.rmtree(victim, ignore_errors=True)
    assert out.startswith("MOUNTED"), out  # the old janitor answered GONE
    assert "owner" in out


@pytest.mark.parametrize("kind", ["symlink", "other-user", "group-writable"])
def test_entries_in_our_own_root_that_are_not_ours_alone_are_left(kind: str,
                                                                   tmp_path: Path) -> None:
    """Even below this user's own pools directory (which no one else can write), an entry
    that is a link, another user's directory or a writable-by-others one is never swept."""
    victim = _victim(tmp_path)
    pools = user_dir("pools")
    entry = pools / f"toolseam-pool-{kind}-{uuid.uuid4().hex[:6]}"
    nobody = pwd.getpwnam("nobody")
    script = f"""
    import os, subprocess
    VICTIM = {victim!r}
    entry = {str(entry)!r}
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", VICTIM], check=True)
    open(os.path.join(VICTIM, "owner"), "w").write({DEAD_OWNER!r})
    if {kind!r} == "symlink":
        os.symlink(VICTIM, entry)
    else:
        os.mkdir(entry)  # made unsafe before it has an owner label: until then, no janitor
        if {kind!r} == "other-user":  # (another test's, in parallel) may take it for a pool
            os.chown(entry, {nobody.pw_uid}, {nobody.pw_gid})
        else:
            os.chmod(entry, 0o775)
        open(os.path.join(entry, "owner"), "w").write({DEAD_OWNER!r})
        subprocess.run(["mount", "--bind", VICTIM, os.path.join(entry)], check=True)
        VICTIM = entry
    """ + _SWEEP_AND_LOOK.replace("victim = sys.argv[1] if len(sys.argv) > 1 else VICTIM",
                                  "victim = VICTIM")
    try:
        out = _in_private_namespace(script)
    finally:
        if entry.is_symlink():
            entry.unlink()
        elif entry.exists():
            shutil.rmtree(entry)
        shutil.rmtree(victim, ignore_errors=True)
    assert out.startswith("MOUNTED"), out


def test_a_dead_pool_of_our_own_is_swept(tmp_path: Path) -> None:
    """The sweep still does its job: a real pool directory of this user's whose owner is gone
    is unmounted and removed."""
    entry = user_dir("pools") / f"toolseam-pool-dead-{uuid.uuid4().hex[:6]}"
    script = f"""
    import os, subprocess
    from toolseam.backends.containers.pool.mounts import sweep_dead_pools
    entry = {str(entry)!r}
    os.mkdir(entry, 0o711)
    open(os.path.join(entry, "owner"), "w").write({DEAD_OWNER!r})
    subprocess.run(["mount", "--bind", entry, entry], check=True)
    removed = sweep_dead_pools()
    mounted = any(line.split()[4] == entry for line in open("/proc/self/mountinfo"))
    print(entry in removed, mounted, os.path.exists(entry))
    """
    assert _in_private_namespace(script).split() == ["True", "False", "False"]


def test_the_pool_and_socket_directories_are_this_users_alone() -> None:
    for name in ("pools", "sockets"):
        st = os.lstat(user_dir(name))
        assert st.st_uid == os.geteuid() and not st.st_mode & 0o022
    _as_nobody(["sh", "-c", f"! touch {user_dir('pools')}/planted 2>/dev/null"])
