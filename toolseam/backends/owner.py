"""Whether the process that made something still runs: its pid and its start time, because a
pid alone is reused. Container labels, inspect's session ids and pool labels write the start
time each in their own form; this is the one comparison."""

from __future__ import annotations

import psutil

_SAME_S = 0.0015  # the forms written keep milliseconds (rounded or cut): within that, the same


def still_runs(pid: int, started_s: float) -> bool:
    """Whether process ``pid`` runs and started at ``started_s`` (seconds since the epoch)."""
    try:
        return abs(psutil.Process(pid).create_time() - started_s) < _SAME_S
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
