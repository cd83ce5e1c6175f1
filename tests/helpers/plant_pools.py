"""Run as root inside ``unshare -m --propagation private``: plant one kind of pool directory
the janitor must not trust (or, ``own_dead``, one it must sweep), with a tmpfs as the victim
mount, run the pool sweep, and print whether the victim is still mounted (JSON).

Usage: python -m tests.helpers.plant_pools CASE SHARED_TMP"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile

NOBODY = 65534
DEAD = f"{socket.gethostname()}:4194000:1.0"  # above pid_max's default: no such process


def as_nobody(action: str) -> None:
    """Run ``action`` (a shell line) as user nobody, as another local user would."""
    subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                    "sh", "-c", action], check=True)


def mounted(path: str) -> bool:
    with open("/proc/self/mountinfo", encoding="utf-8") as info:
        return any(line.split(" ")[4] == path for line in info)


def main(case: str, shared: str) -> None:
    tempfile.tempdir = shared
    os.environ["XDG_CACHE_HOME"] = os.path.join(shared, "no-cache")  # the temp-dir root
    from toolseam.backends import private_dirs
    from toolseam.backends.containers.pool_mounts import sweep_dead_pools

    victim = os.path.join(shared, "victim")
    os.mkdir(victim, 0o755)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=1777", "victim", victim], check=True)
    root = str(private_dirs.private_root())
    planted = os.path.join(root, "toolseam-pool-planted")
    if case == "symlink_in_tmp":  # the attack of issue 32: a name in the shared temp dir
        as_nobody(f"ln -s {victim} {shared}/toolseam-pool-x && echo {DEAD} > {victim}/owner")
        planted = os.path.join(shared, "toolseam-pool-x")
    elif case == "symlink_entry":
        with open(os.path.join(victim, "owner"), "w", encoding="utf-8") as owner:
            owner.write(DEAD)
        os.symlink(victim, planted)
    elif case == "symlinked_root":  # the root's last component swapped for a symlink
        os.rename(root, root + ".moved")
        os.symlink(victim, root)
        os.mkdir(os.path.join(victim, "toolseam-pool-z"))
        with open(os.path.join(victim, "toolseam-pool-z", "owner"), "w", encoding="utf-8") as f:
            f.write(DEAD)
    else:
        os.mkdir(planted, 0o700)
        with open(os.path.join(planted, "owner"), "w", encoding="utf-8") as owner:
            owner.write(DEAD)
        slot = os.path.join(planted, "slot")
        os.mkdir(slot)
        subprocess.run(["umount", victim], check=True)
        victim = slot
        subprocess.run(["mount", "-t", "tmpfs", "victim", victim], check=True)
        if case == "other_owner":
            os.chown(planted, NOBODY, NOBODY)
        elif case == "writable":
            os.chmod(planted, 0o777)
        elif case == "group_writable":
            os.chmod(planted, 0o770)
        elif case == "owner_symlink":  # the label read through a symlink inside
            os.unlink(os.path.join(planted, "owner"))
            with open(os.path.join(shared, "dead-label"), "w", encoding="utf-8") as f:
                f.write(DEAD)
            os.symlink(os.path.join(shared, "dead-label"), os.path.join(planted, "owner"))
        elif case != "own_dead":
            raise SystemExit(f"unknown case {case}")
    swept = sweep_dead_pools()
    print(json.dumps({"mounted": mounted(victim), "exists": os.path.lexists(planted),
                      "swept": swept}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
