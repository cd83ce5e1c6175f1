"""The host backend's resource usage: its agent's process tree, as the kernel counts it
(``/proc`` through psutil) — the host backend has no cgroup of its own here (cgroups v1, and a
session is not given one).

CPU: every live process of the tree by its own time, and every ended one through its parent's
``children_*`` times (the kernel adds a child's time to its parent's when the parent reaps it —
the agent reaps every command and every orphan it adopted), so nothing is counted twice. The
peak of the whole tree is not measurable this way: None, never a sum of per-process peaks.
"""

from __future__ import annotations

import contextlib

import psutil

from ..seam.capabilities import SandboxUsage


def tree_usage(root_pid: int | None) -> SandboxUsage:
    """The usage of ``root_pid`` and everything below it; nothing measured when it is gone."""
    if root_pid is None:
        return SandboxUsage()
    try:
        root = psutil.Process(root_pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return SandboxUsage()
    cpu, rss, alive = 0.0, 0, 0
    for process in tree:
        try:
            with process.oneshot():
                times = process.cpu_times()
                memory = process.memory_info().rss
        except psutil.Error:  # ended while being read: its time is its parent's now
            continue
        cpu += times.user + times.system + times.children_user + times.children_system
        rss += memory
        alive += 1
    return SandboxUsage(cpu_seconds=cpu, memory_bytes=rss, pids=alive)


def kill_tree(root_pid: int | None) -> None:
    """SIGKILL ``root_pid`` and everything below it, the leaves' parents first stopped from
    starting more (the root is killed first: an agent that could respawn is gone)."""
    if root_pid is None:
        return
    try:
        root = psutil.Process(root_pid)
        below = root.children(recursive=True)
    except psutil.Error:
        return
    for process in [root, *below]:
        with contextlib.suppress(psutil.Error):
            process.kill()
