"""The restore property on every container engine (issue 48): whatever sequence of writes,
deletes, renames, chmods, symlinks and directories a command makes between a snapshot and its
restore, the sandbox's workspace holds exactly the snapshot's tree afterwards — bind mode
(the host's code on the host dir, a rootless engine's files given back to its uid) and copy
mode (the engine's archive API, emptied and refilled by the agent). The changes are made and
the tree read by commands inside the sandbox. The same changes are made outside the workspace
too, in the container's writable layer (``/opt/p``, a root that is not read-only) and in its
``/tmp`` (decision 440), which must come back as exactly the snapshot's as well. Few examples
per engine: each costs a few calls, about 1.4 s (the host backend's own test runs 80). Five
drawn examples and the three explicit ones per engine, 40 a run over the five engines, fresh
ones each run (no example database): ten drawn cost 93 s of the suite's worker time for the
same code on every engine (decision 407)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from toolseam import Toolkit
from toolseam.backends.containers.engine.protocol import Hardening

from ..support.engines import ALL_ENGINES, backend
from ..support.sandbox_trees import EMPTY, OPS, Op, apply_ops_in, describe_inside_all, run

PLACES = (".", "/tmp/p", "/opt/p")  # the workspace, the sandbox's tmpfs, its writable layer
Placed = tuple[str, Op]
# made enterable first: the sandbox's root has no CAP_DAC_OVERRIDE for a 0500 directory
_FRESH = ("find /tmp/p /opt/p -type d -exec chmod u+rwx {} + 2>/dev/null; "
          "rm -rf /tmp/p /opt/p; mkdir /tmp/p /opt/p && " + EMPTY)


async def _apply(tk: Toolkit, ops: list[Placed]) -> None:
    await apply_ops_in(tk, {place: [op for where, op in ops if where == place]
                            for place in PLACES})


async def _describe(tk: Toolkit) -> list[object]:
    return list(await describe_inside_all(tk, list(PLACES)))


async def _one(tk: Toolkit, before: list[Placed], between: list[Placed], again: bool) -> None:
    await run(tk, _FRESH)
    await _apply(tk, before)
    snap = await tk.snapshot("property")
    expected = await _describe(tk)
    await _apply(tk, between)
    if again:  # a later snapshot of the same session must not mislead the restore
        await tk.snapshot("again")
    await tk.restore(snap)
    assert await _describe(tk) == expected


@pytest.mark.parametrize("engine", ALL_ENGINES)
def test_restore_leaves_exactly_the_snapshots_tree_in_the_sandbox(
        engine: str, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLSEAM_SNAPSHOTS", str(tmp_path / "store"))
    loop = asyncio.new_event_loop()
    tk = Toolkit(backend(engine, str(workspace), hardening=Hardening(read_only_root=False)))
    loop.run_until_complete(tk.open())

    placed = st.tuples(st.sampled_from(PLACES), OPS)

    @settings(max_examples=5, deadline=None, database=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(before=st.lists(placed, max_size=8), between=st.lists(placed, max_size=8),
           again=st.booleans())
    @example(before=[(".", ("mkdir", b"a")), (".", ("write", b"a/b", b"1")),
                     (".", ("chmod", b"a", 0o500))],
             between=[(".", ("delete", b"a")), (".", ("symlink", b"a", b"/etc"))], again=True)
    @example(before=[(".", ("write", b"a", b"xyz"))],
             between=[(".", ("same-size", b"a", b"q"))], again=False)
    @example(before=[("/opt/p", ("mkdir", b"a")), ("/opt/p", ("write", b"a/b", b"1")),
                     ("/tmp/p", ("write", b"c\xff", b"t")), ("/opt/p", ("chmod", b"a", 0o500))],
             between=[("/opt/p", ("delete", b"a")), ("/opt/p", ("symlink", b"a", b"/etc")),
                      ("/opt/p", ("write", b"a/b", b"through the link")),
                      ("/tmp/p", ("same-size", b"c\xff", b"q"))], again=True)
    def check(before: list[Placed], between: list[Placed], again: bool) -> None:
        loop.run_until_complete(_one(tk, before, between, again))

    try:
        check()
    finally:
        loop.run_until_complete(tk.close())
        loop.close()
