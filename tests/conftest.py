"""Shared fixtures, and the engines marker. Engines are never mocked: backend tests run against
the real thing. Helpers live in ``tests/support/`` (no test module imports another)."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .support.engines import ALL_ENGINES, remove_shared, shared_dir
from .support.processes import scratch_root


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A fresh directory a rootless engine's user can reach (``engines.shared_dir``), removed
    afterwards: the host dir of a container session."""
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


@pytest.fixture
def outside_tree() -> Iterator[Path]:
    """A directory outside every temp dir holding ``inside/`` (a base dir) and ``outside.txt``
    (a file a read from there must ask about), removed afterwards."""
    work = scratch_root() / f"mcp-{os.getpid()}-{time.monotonic_ns()}"
    (work / "inside").mkdir(parents=True)
    (work / "outside.txt").write_text("outside\n")
    yield work
    shutil.rmtree(work, ignore_errors=True)


# --- what a test needs: engine tests are marked at collection (issue 34) -----------------------
# A test parametrized over an engine's name (podman-rootless, docker-remote, "podman:copy" …; the
# names are ``support.engines.ALL_ENGINES``) needs that engine; so does a contract binding whose
# class names one (``engine = "docker"``). Modules whose tests need an engine without naming it
# say so with ``pytestmark = pytest.mark.engines`` (or the mark on the test). The folders say
# the rest: tests/unit/ and tests/host/ need no engine, and a test there that names one is an
# error at collection (it belongs in tests/backends/ or tests/contract/). ``pytest tests/unit``
# is the fast loop; ``pytest -m "not engines"`` runs everything that needs no engine.
_NO_ENGINE_FOLDERS = ("unit", "host")


def _names_an_engine(value: object) -> bool:
    if isinstance(value, str):
        return value.startswith(ALL_ENGINES)
    if isinstance(value, (tuple, list)):
        return any(_names_an_engine(v) for v in value)
    # an object that says which engine it needs (a docs example: tests/support/doc_examples.py)
    engine = getattr(value, "engine", None)
    return isinstance(engine, str) and engine.startswith(ALL_ENGINES)


def _needs_an_engine(item: pytest.Item) -> bool:
    if item.get_closest_marker("engines") is not None:
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(_names_an_engine(v) for v in callspec.params.values()):
        return True
    return _names_an_engine(getattr(getattr(item, "cls", None), "engine", None))


def _folder(item: pytest.Item) -> str:
    tests = Path(__file__).parent
    relative = item.path.relative_to(tests) if item.path.is_relative_to(tests) else item.path
    return relative.parts[0] if len(relative.parts) > 1 else ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    misplaced = []
    # scripts/test gives its Ray run only these files (found by their mark): a test marked
    # ray elsewhere would run in neither run
    ray_files = os.environ.get("TOOLSEAM_RAY_FILES")
    unlisted = []
    for item in items:
        if item.get_closest_marker("ray") is not None:  # its group: support/ray_cluster.py
            item.add_marker(pytest.mark.engines)
            if ray_files is not None and item.nodeid.split("::")[0] not in ray_files.split():
                unlisted.append(item.nodeid)
        if _needs_an_engine(item):
            item.add_marker(pytest.mark.engines)
            if _folder(item) in _NO_ENGINE_FOLDERS:
                misplaced.append(item.nodeid)
    if unlisted:
        raise pytest.UsageError("tests marked ray in a file scripts/test's Ray run is not given "
                                "(it finds them by RAY_TESTS or mark.ray): " + ", ".join(unlisted))
    if misplaced:
        raise pytest.UsageError("these tests need a container engine, so they belong in "
                                "tests/backends/ or tests/contract/: " + ", ".join(misplaced))


@pytest.fixture(scope="session")
def ray_session_cluster() -> Iterator[object]:
    """A real 3-node Ray cluster on 127.0.0.1 for the whole session (tests/support/ray_cluster.py)."""
    from .support.ray_cluster import started

    with started() as cluster:
        yield cluster


@pytest.fixture
def ray_cluster(ray_session_cluster: Any) -> Iterator[object]:
    """The session's Ray cluster for one test. A node the test killed is dead to Ray before
    the next test begins: Ray reports a killed node alive for several seconds, and a driver
    that did not see it die (a later test's script) would place work there."""
    yield ray_session_cluster
    ray_session_cluster.settle()
