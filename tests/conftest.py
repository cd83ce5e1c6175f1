"""Shared fixtures. Engines are never mocked: backend tests run against the real thing."""

from __future__ import annotations

import psutil


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
