"""The sandboxes of sessionless MCP clients: a default one per principal; only a minted handle
reaches a sandbox, and only for its own principal; a principal at its most has its own least
recently used idle sandbox closed, never another's; idle sandboxes (and only idle ones) are
taken for closing, least recently used first."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolseam import Toolkit
from toolseam.frontends.mcp.sandboxes import Handles, Sandbox, SandboxRefused


def table(**options: Any) -> Handles:
    return Handles(lambda: Toolkit("host"), **options)


def mint(handles: Handles, principal: str = "local") -> Sandbox:
    sandbox, evicted = handles.mint(principal)
    assert evicted == []
    return sandbox


def test_a_minted_handle_reaches_its_sandbox_and_nothing_else_does() -> None:
    handles = table()
    one, two = mint(handles), mint(handles)
    assert one.handle and two.handle and one.handle != two.handle
    assert len(one.handle) >= 43  # 256 bits, URL-safe
    assert handles.get(one.handle) is one and handles.get(two.handle) is two
    for guess in (one.handle[:-1], one.handle + "=", one.handle.upper(), ""):
        with pytest.raises(SandboxRefused, match="no open sandbox has this handle"):
            handles.get(guess)


@given(st.text())
def test_no_guess_opens_a_sandbox(guess: str) -> None:
    handles = table()
    minted = mint(handles)
    if guess == minted.handle:
        return
    with pytest.raises(SandboxRefused):
        handles.get(guess)


def test_a_full_principal_closes_its_own_least_recently_used_never_anothers() -> None:
    handles = table(most=2)
    theirs = mint(handles, "bob")
    first, second = mint(handles), mint(handles)
    first.last_used, second.last_used = 1.0, 2.0
    third, evicted = handles.mint()
    assert evicted == [first] and handles.count("local") == 2
    with pytest.raises(SandboxRefused):
        handles.get(first.handle or "")
    second.busy = third.busy = 1  # all its own busy: refused, naming only its own
    with pytest.raises(SandboxRefused, match="your 2 sandboxes are all running calls"):
        handles.mint()
    assert handles.get(theirs.handle or "", "bob") is theirs
    assert mint(handles, "bob") is not theirs  # the other principal is never refused


def test_a_handle_reaches_its_sandbox_only_for_its_principal() -> None:
    handles = table()
    mine = mint(handles, "alice")
    with pytest.raises(SandboxRefused):
        handles.get(mine.handle or "", "mallory")
    assert handles.default("alice") is handles.default("alice")
    assert handles.default("alice") is not handles.default("mallory")


def test_only_idle_sandboxes_are_taken() -> None:
    handles = table(idle_seconds=60)
    idle, busy, fresh = mint(handles), mint(handles), mint(handles)
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
    from toolseam.frontends.mcp.server import McpTools
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
    tools.handles.mint("local"), tools.handles.mint("local")
    await tools.close_all()
    assert closed == ["kept", "plain"] and tools.toolkits == []
    assert "closing a sandbox: " in capsys.readouterr().err
