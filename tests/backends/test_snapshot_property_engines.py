"""The restore property on every container engine (issue 48): whatever sequence of writes,
deletes, renames, chmods, symlinks and directories a command makes between a snapshot and its
restore, the sandbox's workspace holds exactly the snapshot's tree afterwards — bind mode
(the host's code on the host dir, a rootless engine's files given back to its uid) and copy
mode (the engine's archive API, emptied and refilled by the agent). The changes are made and
the tree read by commands inside the sandbox. Few examples per engine: each costs a few calls
(the host backend's own test runs 80)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from toolseam import Toolkit

from ..support.engines import ALL_ENGINES, backend
from ..support.sandbox_trees import EMPTY, OPS, Op, apply_ops, describe_inside, run


async def _one(tk: Toolkit, before: list[Op], between: list[Op], again: bool) -> None:
    await run(tk, EMPTY)
    await apply_ops(tk, before)
    snap = await tk.snapshot("property")
    expected = await describe_inside(tk)
    await apply_ops(tk, between)
    if again:  # a later snapshot of the same session must not mislead the restore
        await tk.snapshot("again")
    await tk.restore(snap)
    assert await describe_inside(tk) == expected


@pytest.mark.parametrize("engine", ALL_ENGINES)
def test_restore_leaves_exactly_the_snapshots_tree_in_the_sandbox(
        engine: str, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLSEAM_SNAPSHOTS", str(tmp_path / "store"))
    loop = asyncio.new_event_loop()
    tk = Toolkit(backend(engine, str(workspace)))
    loop.run_until_complete(tk.open())

    @settings(max_examples=15, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(before=st.lists(OPS, max_size=8), between=st.lists(OPS, max_size=8),
           again=st.booleans())
    @example(before=[("mkdir", b"a"), ("write", b"a/b", b"1"), ("chmod", b"a", 0o500)],
             between=[("delete", b"a"), ("symlink", b"a", b"/etc")], again=True)
    @example(before=[("write", b"a", b"xyz")], between=[("same-size", b"a", b"q")],
             again=False)
    def check(before: list[Op], between: list[Op], again: bool) -> None:
        loop.run_until_complete(_one(tk, before, between, again))

    try:
        check()
    finally:
        loop.run_until_complete(tk.close())
        loop.close()
