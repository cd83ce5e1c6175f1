"""Shared fixtures. Engines are never mocked: backend tests run against the real thing."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest


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


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A fresh directory a rootless engine's user can reach (``engines.shared_dir``), removed
    afterwards: the host dir of a container session."""
    from .engines import remove_shared, shared_dir

    path = shared_dir()
    yield path
    remove_shared(path)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh directory under ``scratch_root()``, removed afterwards (never in the checkout)."""
    path = scratch_root() / uuid.uuid4().hex[:10]
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


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


# --- what a test needs: engine tests are marked at collection (issue 34) -----------------------
# Every engine's name in the suite starts with one of these (podman-rootless, docker-remote,
# "podman:copy" …): a test parametrized over one needs that engine. Modules whose tests all need
# an engine without naming it in a parameter say so with ``pytestmark = pytest.mark.engines``.
# ``pytest -m "not engines"`` is the loop that needs none (README, "Working on toolseam").
_ENGINE_PREFIXES = ("podman", "docker")


def _names_an_engine(value: object) -> bool:
    if isinstance(value, str):
        return value.startswith(_ENGINE_PREFIXES)
    if isinstance(value, (tuple, list)):
        return any(_names_an_engine(v) for v in value)
    return False


def _needs_an_engine(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(_names_an_engine(v) for v in callspec.params.values()):
        return True
    # a contract binding names its engine as a class attribute (test_contract_containers.py)
    return _names_an_engine(getattr(getattr(item, "cls", None), "engine", None))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _needs_an_engine(item):
            item.add_marker(pytest.mark.engines)
        if item.get_closest_marker("ray") is not None:  # one cluster: one xdist worker
            item.add_marker(pytest.mark.xdist_group("ray-cluster"))
            item.add_marker(pytest.mark.engines)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """A real 3-node Ray cluster on 127.0.0.1 for the whole session (tests/helpers/ray_cluster.py)."""
    from .helpers.ray_cluster import started

    with started() as cluster:
        yield cluster
