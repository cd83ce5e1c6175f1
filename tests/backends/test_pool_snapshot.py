"""``SandboxPool(..., snapshot=snap)`` on the real engines (issue 48): every hand-out starts with
exactly the snapshot's files, as its commands see them; what one session changes — in its
workspace and in its /tmp — never reaches another hand-out, before or after it closed; a
hand-out's own base dir is made the snapshot's tree; and once the pool closes no private
workspace or container of it is left. The parts that need no engine:
tests/host/test_pool_snapshot_parts.py."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from toolseam import SandboxPool, Toolkit
from toolseam.backends.containers.labels import POOL_LABEL

from ..support.contract_bindings import pool_factory
from ..support.engines import ENGINES, backend
from ..support.sandbox_trees import describe_inside, run
from ..support.snapshot_stores import own_store, snapshot_of
from ..support.trees import describe


@pytest.fixture(autouse=True)
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return own_store(tmp_path / "store", monkeypatch)


def _pool_containers(engine: str, where: Path, pool_id: str) -> list[str]:
    engine_api = backend(engine, str(where)).sandbox.engine  # type: ignore[attr-defined]
    return [c for c, labels in engine_api.labeled(POOL_LABEL)
            if labels.get(POOL_LABEL) == pool_id]


# The local engines bind the warm workspace; docker over TLS copies it in (copy mode).
@pytest.mark.parametrize("engine", [*ENGINES, "docker-remote"])
async def test_every_hand_out_starts_from_the_snapshot_and_none_sees_another(
        engine: str, tmp_path: Path, workspace: Path, store: Path) -> None:
    snap, expected = await snapshot_of(tmp_path / "source")
    async with SandboxPool(pool_factory(engine), size=2, snapshot=snap) as pool:
        await pool.wait_full()
        assert pool.warm_workspaces == 2  # filled before anyone asked
        first, beside = await asyncio.gather(pool.toolkit(), pool.toolkit())
        handed = [tk.backend.sandbox.workspace for tk in (first, beside)]  # type: ignore[attr-defined]
        assert await describe_inside(first) == expected
        assert await run(first, "./run.sh") == "ran\n"
        await run(first, "echo changed > src/app.py && rm run.sh && rmdir empty && chmod 700 src"
                         " && echo mine > new.txt && echo mark > /tmp/mark")
        assert await describe_inside(beside) == expected  # running at the same time
        assert await run(beside, "ls /tmp") == ""
        containers = {first.backend.sandbox.container}  # type: ignore[attr-defined]
        await first.close()
        assert not os.path.exists(handed[0])  # its private workspace went with it
        later = await pool.toolkit()  # after the first one was returned
        handed.append(later.backend.sandbox.workspace)  # type: ignore[attr-defined]
        containers.add(later.backend.sandbox.container)  # type: ignore[attr-defined]
        assert len(containers) == 2  # discarded, never handed out again (decision 435)
        assert await describe_inside(later) == expected
        assert await run(later, "ls /tmp") == ""
        for tk in (beside, later):
            await tk.close()
        assert pool.warm_workspaces > 0
    assert [path for path in handed if os.path.exists(path)] == []
    assert list((store / "branches").iterdir()) == []
    assert _pool_containers(engine, workspace, pool.pool_id) == []
    assert describe(tmp_path / "source") == expected  # the source was never touched


@pytest.mark.parametrize("engine", ["podman-rootless", "docker"])
async def test_a_hand_out_base_dir_is_made_the_snapshot_and_a_bare_backend_too(
        engine: str, tmp_path: Path, workspace: Path, store: Path) -> None:
    """With a base dir, that directory becomes the snapshot's tree (what was there before is
    gone) and the session's changes land there; ``pool.backend()`` hands out the snapshot too,
    its private workspace removed once it closed."""
    snap, expected = await snapshot_of(tmp_path / "source")
    (workspace / "stale.txt").write_text("from before\n")
    async with SandboxPool(pool_factory(engine), size=1, snapshot=snap.id) as pool:
        tk = await pool.toolkit(workspace)
        assert await describe_inside(tk) == expected
        await run(tk, "echo kept > new.txt")
        await tk.close()
        assert (workspace / "new.txt").read_text() == "kept\n"
        assert not (workspace / "stale.txt").exists()
        bare = await pool.backend()
        bare_workspace = bare.sandbox.workspace
        async with Toolkit(bare) as raw:
            assert await describe_inside(raw) == expected
            await run(raw, "echo scratch > src/app.py")
        assert os.path.isdir(bare_workspace)  # a bare backend's close does not remove it
        again = await pool.toolkit()  # the closed backend's workspace is removed first
        assert not os.path.exists(bare_workspace)
        assert await describe_inside(again) == expected
        again_workspace = again.backend.sandbox.workspace  # type: ignore[attr-defined]
        await again.close()
        assert not os.path.exists(again_workspace)
    assert list((store / "branches").iterdir()) == []
