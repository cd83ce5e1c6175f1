"""The handle table of sessionless MCP clients: only a minted handle reaches a sandbox, a full
table refuses rather than evicts, idle sandboxes (and only idle ones) are taken for closing."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolseam import Toolkit
from toolseam.mcp_sandboxes import Handles, SandboxRefused


def table(**options: float) -> Handles:
    return Handles(lambda: Toolkit("host"), **options)


def test_a_minted_handle_reaches_its_sandbox_and_nothing_else_does() -> None:
    handles = table()
    one, two = handles.mint(), handles.mint()
    assert one.handle and two.handle and one.handle != two.handle
    assert len(one.handle) >= 43  # 256 bits, URL-safe
    assert handles.get(one.handle) is one and handles.get(two.handle) is two
    for guess in (one.handle[:-1], one.handle + "=", one.handle.upper(), ""):
        with pytest.raises(SandboxRefused, match="no open sandbox has this handle"):
            handles.get(guess)


@given(st.text())
def test_no_guess_opens_a_sandbox(guess: str) -> None:
    handles = table()
    minted = handles.mint()
    if guess == minted.handle:
        return
    with pytest.raises(SandboxRefused):
        handles.get(guess)


def test_a_full_table_refuses_instead_of_evicting() -> None:
    handles = table(most=2)
    first, _ = handles.mint(), handles.mint()
    with pytest.raises(SandboxRefused, match="2 sandboxes are open"):
        handles.mint()
    assert first.handle is not None and handles.get(first.handle) is first


def test_only_idle_sandboxes_are_taken() -> None:
    handles = table(idle_seconds=60)
    idle, busy, fresh = handles.mint(), handles.mint(), handles.mint()
    now = time.monotonic()
    idle.last_used = busy.last_used = now - 61
    busy.busy = 1  # a call in flight
    assert handles.take_idle(now) == [idle]
    assert idle.handle is not None
    with pytest.raises(SandboxRefused):
        handles.get(idle.handle)
    assert {box.handle for box in handles.take_all()} == {busy.handle, fresh.handle}


async def test_one_failed_close_leaves_no_other_sandbox_open(capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    from toolseam.mcp_server import McpTools
    from toolseam.seam.errors import CouldNotRunError

    closed: list[str] = []

    class Kept(Toolkit):
        async def close(self) -> None:
            closed.append("kept")
            raise CouldNotRunError("the work is kept in container c1: toolseam recover …",
                                   retryable=False)

    class Plain(Toolkit):
        async def close(self) -> None:
            closed.append("plain")
            await super().close()

    made = iter([Plain("host"), Kept("host"), Plain("host")])  # the first is the probe
    tools = McpTools(lambda: next(made))
    tools.handles.mint(), tools.handles.mint()
    await tools.close_all()
    assert closed == ["kept", "plain"] and tools.toolkits == []
    assert "closing a sandbox: " in capsys.readouterr().err
