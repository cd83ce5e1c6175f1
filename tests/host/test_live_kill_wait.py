"""``ps --kill`` of a session whose engine takes its time (issue 49): CI saw ``ps`` list a
podman session and ``ps --kill`` then say "no live session" — the owner was still removing the
container when the asker's wait ran out, and a wait that ran out read as "not found". The owner
now says "found" at once and the outcome when it has it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from toolseam.observability import live
from toolseam.seam.capabilities import SandboxKill
from toolseam.seam.errors import CouldNotRunError

from ..support.timing import patience


class SlowKill:
    capabilities = frozenset({SandboxKill})  # declared, as seam.capabilities.supports reads

    def __init__(self, seconds: float, fails: bool = False) -> None:
        self.seconds, self.fails = seconds, fails
        self.killed = threading.Event()

    def kill_sandbox(self) -> None:
        time.sleep(self.seconds)
        if self.fails:
            raise RuntimeError("the engine refused")
        self.killed.set()


@pytest.fixture
def table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[live.LiveTable]:
    sockets = tmp_path / "live"
    sockets.mkdir(mode=0o700)
    monkeypatch.setattr(live, "live_dir", lambda: sockets)
    # the answer wait far below the kill's time: before the fix this read as "not found"
    monkeypatch.setattr(live, "_ANSWER_WAIT_S", ANSWER_WAIT_S)
    held = live.LiveTable()
    yield held
    held.close()
    while loops:
        loops.pop().close()
    assert not list(sockets.iterdir())


loops: list[asyncio.AbstractEventLoop] = []
# far below the slow kill's time, yet enough for a thread of this process to say "found" on a
# loaded machine (0.3 s was not, under a full run)
ANSWER_WAIT_S = patience(1.0)


def _hold(table: live.LiveTable, session_id: str, backend: Any) -> None:
    observer: Any = SimpleNamespace(session_id=session_id, backend="podman", attributes={},
                                    meter=SimpleNamespace(calls={}, egress={}))
    loops.append(asyncio.new_event_loop())
    table.add(live.LiveSession(observer=observer, backend=backend, loop=loops[-1],
                               durable=False))


def test_a_kill_slower_than_the_answer_wait_is_reported_killed(table: live.LiveTable) -> None:
    slow = SlowKill(3 * ANSWER_WAIT_S)
    _hold(table, "s-slow", slow)
    assert live.kill_session("s-slow") is True
    assert slow.killed.is_set()


def test_an_engine_failure_after_found_is_said(table: live.LiveTable) -> None:
    _hold(table, "s-fails", SlowKill(0.5, fails=True))
    with pytest.raises(CouldNotRunError, match="s-fails: RuntimeError: the engine refused"):
        live.kill_session("s-fails")


def test_an_unknown_id_is_not_found_beside_a_held_one(table: live.LiveTable) -> None:
    _hold(table, "s-held", SlowKill(0))
    assert live.kill_session("s-other") is False


def test_a_kill_past_its_wait_names_the_owner(table: live.LiveTable,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "_KILL_WAIT_S", 0.5)
    _hold(table, "s-stuck", SlowKill(3))
    with pytest.raises(CouldNotRunError, match=r"its owner \(pid \d+\) had not ended it"):
        live.kill_session("s-stuck")


class Vanishes:
    """An owner that ends as its sandbox goes — before its answer is written (what the podman
    flake was: the owner saw ``sandbox_lost``, printed it and exited)."""

    capabilities = frozenset({SandboxKill})

    def __init__(self, table: live.LiveTable, session_id: str) -> None:
        self.table, self.session_id = table, session_id

    def kill_sandbox(self) -> None:
        self.table.remove(self.session_id)
        raise SystemExit  # the handler thread ends without a word; its socket is closed


# the owner's handler thread ending by SystemExit is the point of these two
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_owner_gone_before_answering_is_a_kill(table: live.LiveTable) -> None:
    _hold(table, "s-gone", Vanishes(table, "s-gone"))
    assert live.kill_session("s-gone") is True


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_owner_that_hangs_up_but_still_holds_it_is_no_kill(table: live.LiveTable) -> None:
    class HangsUp:
        capabilities = frozenset({SandboxKill})

        def kill_sandbox(self) -> None:
            raise SystemExit

    _hold(table, "s-kept", HangsUp())
    with pytest.raises(CouldNotRunError, match="s-kept: its owner closed the connection"):
        live.kill_session("s-kept")
