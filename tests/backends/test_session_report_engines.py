"""Accounting on every engine (issue 49): the container's cgroup as its engine reports it
(``ResourceUsage``), None where the engine cannot measure (rootless podman on cgroups v1),
and the ``SessionReport`` close returns — its CPU and peak from the cgroup where there is one,
else from the commands' wait4 figures, never a guess."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolseam import Toolkit
from toolseam.seam.capabilities import ResourceUsage

from ..support.engines import ALL_ENGINES, backend

pytestmark = pytest.mark.engines
BUSY = "python3 -c 's = 0\nfor i in range(4_000_000): s += i'"
HOG = "python3 -c 'x = bytearray(96 << 20); x[::4096] = b\"a\" * len(x[::4096])'"
NO_CGROUP = {"podman-rootless"}  # cgroups v1 here: rootless podman gets none of its own


@pytest.mark.parametrize("engine", ALL_ENGINES)
async def test_report_and_usage_on_every_engine(engine: str, workspace: Path) -> None:
    sandbox = backend(engine, str(workspace))
    tk = Toolkit(sandbox)
    try:
        assert isinstance(sandbox, ResourceUsage)
        busy = await tk.call("bash", {"command": BUSY})
        hog = await tk.call("bash", {"command": HOG})
        assert not busy.is_error and not hog.is_error, (busy.output, hog.output)
        usage = await sandbox.resource_usage()
        if engine in NO_CGROUP:
            assert usage.cpu_seconds is None and usage.pids is None and usage.memory_bytes is None
        else:
            assert usage.cpu_seconds is not None and usage.cpu_seconds >= 0.1
            assert usage.pids is not None and usage.pids >= 1  # the agent at least
            assert usage.memory_bytes is not None and usage.memory_bytes > 0
    finally:
        report = await tk.close()
    assert report.calls == {"ok": 2}
    assert report.cpu_seconds is not None and report.cpu_seconds >= 0.1
    assert report.memory_peak_bytes is not None and report.memory_peak_bytes >= 96 << 20
    assert (await sandbox.resource_usage()).cpu_seconds is None  # closed: nothing measured
