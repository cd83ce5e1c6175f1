"""Processes and directories on this machine: what a test checks was left behind, and where a
test may make files the read scope does not already allow."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import psutil


def scratch_root() -> Path:
    """A writable directory OUTSIDE every temp dir: the read scope always allows temp dirs, so
    tests of what asks must live elsewhere (the clone itself may sit under /tmp in CI)."""
    temp_roots = {"/tmp", "/var/tmp", tempfile.gettempdir()}
    for candidate in (Path("/var/lib/toolseam-tests"), Path.home() / ".cache" / "toolseam-tests"):
        if any(str(candidate).startswith(t.rstrip("/") + "/") for t in temp_roots):
            continue
        try:
            candidate.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            return candidate
    raise RuntimeError("no writable directory outside the temp dirs for read-scope tests")


def host_started(marker: str, timeout_s: float = 5.0) -> list[str]:
    """``host_survivors(marker)`` once it is not empty (or after ``timeout_s``): a command
    answered as started may still be between two execs (``sh -c`` becoming ``sleep``), when
    its command line reads empty."""
    deadline = time.monotonic() + timeout_s
    found = host_survivors(marker)
    while not found and time.monotonic() < deadline:
        time.sleep(0.02)
        found = host_survivors(marker)
    return found


def host_survivors(marker: str) -> list[str]:
    """Command lines of live processes on this machine that contain ``marker``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if marker in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid}: {cmdline}")
        except psutil.Error:
            continue
    return found
