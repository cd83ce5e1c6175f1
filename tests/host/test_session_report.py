"""Accounting (issue 49): ``JobStatus.cpu_seconds`` / ``memory_peak_bytes`` from the agent's
wait4, and the ``SessionReport`` that ``close`` returns and logs — on the host backend (the
engines: tests/backends/test_session_report_engines.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolseam import SessionReport, SyncToolkit, Toolkit
from toolseam.seam.models import SpawnRequest
from toolseam.testing.fake import FakeBackend

BUSY = "python3 -c 's = 0\nfor i in range(4_000_000): s += i'"
HOG = "python3 -c 'x = bytearray(96 << 20); x[::4096] = b\"a\" * len(x[::4096])'"


async def test_a_job_reports_its_cpu_and_peak_memory(tmp_path: Path) -> None:
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        for command, cpu_at_least, peak_at_least in ((BUSY, 0.1, 0), (HOG, 0.0, 96 << 20)):
            status = await tk.backend.start(SpawnRequest(
                job=f"acct-{peak_at_least}", argv=["/bin/sh", "-c", command], cwd=str(tmp_path),
                env={"PATH": "/usr/bin:/bin"}, forget_when_done=True))
            assert status.state == "exited" and status.exit_code == 0, status.output
            assert status.cpu_seconds is not None and status.cpu_seconds >= cpu_at_least
            assert status.memory_peak_bytes is not None
            assert status.memory_peak_bytes >= peak_at_least


async def test_close_returns_and_logs_the_report(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="toolseam.session")
    tk = Toolkit("host", base_dir=str(tmp_path))
    await tk.call("bash", {"command": BUSY})
    await tk.call("write", {"path": "a.txt", "content": "héllo"})  # 6 bytes
    await tk.call("edit", {"path": "a.txt", "oldString": "llo", "newString": "LLO!"})
    await tk.call("apply_patch", {"patchText": "*** Begin Patch\n*** Add File: b.txt\n+xy\n"
                                                "*** End Patch"})
    await tk.call("read", {"path": "missing.txt"})
    await tk.call("bash", {"command": "exit 4"})
    report = await tk.close()
    assert isinstance(report, SessionReport)
    assert report.calls == {"ok": 4, "error": 2}
    assert report.bytes_written == 6 + 7 + 3
    assert report.cpu_seconds is not None and report.cpu_seconds >= 0.1
    assert report.memory_peak_bytes is not None and report.memory_peak_bytes > 1 << 20
    assert report.wall_seconds > 0 and report.egress == {} and report.backend == "host"
    assert await tk.close() is report  # a second close: the same report
    logged = [r for r in caplog.records if r.name == "toolseam.session"]
    assert len(logged) == 1 and report.session_id in logged[0].getMessage()
    assert logged[0].__dict__["toolseam_report"] is report


async def test_a_backend_that_cannot_measure_reports_none() -> None:
    """Never a guess: the fake backend runs no process, so there is no figure at all."""
    async with Toolkit(FakeBackend()) as tk:
        await tk.call("read", {"path": "x"})
    report = tk.report
    assert report is not None and report.cpu_seconds is None and report.memory_peak_bytes is None


def test_without_telemetry_nothing_of_opentelemetry_is_imported(tmp_path: Path) -> None:
    """In a fresh interpreter (pytest's plugins load the API themselves): sessions, calls and
    the report import nothing of OpenTelemetry when it is not configured."""
    script = (
        "import asyncio, sys\n"
        "from toolseam import Toolkit\n"
        "async def main():\n"
        f"    async with Toolkit('host', base_dir={str(tmp_path)!r}) as tk:\n"
        "        await tk.call('bash', {'command': 'true'})\n"
        "        await tk.call('read', {'path': 'x'})\n"
        "    assert tk.report is not None\n"
        "asyncio.run(main())\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, check=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout


def test_sync_toolkit_returns_the_report(tmp_path: Path) -> None:
    tk = SyncToolkit("host", base_dir=str(tmp_path))
    tk.call("bash", {"command": "true"})
    report = tk.close()
    assert report.calls == {"ok": 1} and tk.close() is report
