"""A container's resource usage from its engine's cgroup statistics (``GET /containers/ID/stats``,
the same compatible call on docker and podman), as the seam's ``SandboxUsage``.

A figure the engine cannot measure is None, never a number it reports anyway: rootless podman
on cgroups v1 has no cgroup of its own and answers zero CPU, no pids and the memory of the whole
machine — so a sample without a pid count is a sample of nothing.
"""

from __future__ import annotations

from typing import Any

from ...seam.capabilities import SandboxUsage

NOT_MEASURED = SandboxUsage()


def usage_from_stats(stats: dict[str, Any]) -> SandboxUsage:
    """One stats sample as usage; ``NOT_MEASURED`` where the container has no cgroup."""
    pids = (stats.get("pids_stats") or {}).get("current")
    if not isinstance(pids, int) or pids <= 0:
        return NOT_MEASURED
    cpu_ns = ((stats.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    memory = stats.get("memory_stats") or {}
    usage, peak = memory.get("usage"), memory.get("max_usage")  # max_usage: cgroups v1, docker
    return SandboxUsage(
        cpu_seconds=cpu_ns / 1e9 if isinstance(cpu_ns, int) else None,
        memory_bytes=usage if isinstance(usage, int) else None,
        memory_peak_bytes=peak if isinstance(peak, int) and peak > 0 else None,
        pids=pids)


