"""Leaving a ``SandboxPool`` is bounded when a refill is starting (issue 33, item 7): the
starting sandbox is cancelled and its container removed, not waited for. On podman it took
10.9 s: its remove of a running container sent SIGTERM and waited 10 s for an agent that had
not got as far as handling it.

The refill is held at the one moment that cost the time — its container created and running,
its agent not yet answered — by a backend whose launch, after the real one, waits forever. The
engine, the container and its removal are real.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from toolseam import SandboxPool
from toolseam.backends.containers.labels import POOL_LABEL

from ..support.engines import ENGINES, backend, remove_shared, shared_dir

CLOSE_BOUND_S = 4.0  # a remove is ≈ 0.3-0.5 s here; podman's stop timeout was 10 s


def _left(engine: str, where: Path, pool_id: str) -> list[str]:
    """The pool's containers and volumes still on the engine."""
    found = backend(engine, str(where)).sandbox.engine  # type: ignore[attr-defined]
    try:
        return [name for name, labels in [*found.labeled(POOL_LABEL),
                                          *found.labeled_volumes(POOL_LABEL)]
                if labels.get(POOL_LABEL) == pool_id]
    finally:
        found.close()


@pytest.mark.asyncio
@pytest.mark.parametrize("engine", ENGINES)
async def test_closing_a_pool_while_a_refill_starts_is_quick_and_leaves_nothing(
        engine: str) -> None:
    launched = asyncio.Event()

    def stalled(workspace: str, **options: Any) -> Any:
        made = backend(engine, workspace, **options)
        launch = made.sandbox.launch  # type: ignore[attr-defined]

        async def launch_then_wait(*args: Any, **kwargs: Any) -> None:
            await launch(*args, **kwargs)
            launched.set()
            await asyncio.Event().wait()  # the agent's hello is never awaited

        made.sandbox.launch = launch_then_wait  # type: ignore[attr-defined]
        return made

    where = shared_dir()
    try:
        pool = SandboxPool(stalled, size=1)
        await pool.start()
        await asyncio.wait_for(launched.wait(), 60)
        assert pool.starting == 1 and _left(engine, where, pool.pool_id)  # it is running
        began = time.monotonic()
        await pool.close()
        took = time.monotonic() - began
        assert took < CLOSE_BOUND_S, f"closing the pool took {took:.1f} s"
        assert _left(engine, where, pool.pool_id) == []
        await asyncio.sleep(1)  # nothing the cancelled start was doing appears afterwards
        assert _left(engine, where, pool.pool_id) == []
    finally:
        remove_shared(where)
