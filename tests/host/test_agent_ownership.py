"""Whose process is it (issue 45, decision 345): each job's processes are its root's
descendants, so a call's end takes nothing of another call's, nor the agent's own helpers.

Both cases failed with ownership by start time: the agent's clock is pinned here (every job
"starts" at tick 0, as two calls in one 10 ms tick do), which the old scheme read and the
roots ignore, so the window that took load to hit is always open.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

from ..support.agent_process import START, AgentProcess

# The same tick for every job, and a search process that lingers after it has answered (its
# exit tears a copy of the agent's address space down, which takes long under load): the
# test_stdio_lists_and_calls_all_seven case, where `grep` then `bash` reported the grep's
# process as the command's leftover and killed it.
_PINNED_AND_LINGERING = """
import os, time
from toolseam_agent import procscan
procscan.now_ticks = lambda: 0  # before anything imports it by name
from toolseam_agent import searcher
_child = searcher._child
def _lingering(read_fd, write_fd, run):
    real_exit = os._exit
    def late_exit(status):
        time.sleep(1.0)
        real_exit(status)
    os._exit = late_exit  # in the forked search process only
    _child(read_fd, write_fd, run)
searcher._child = _lingering
""" + START

ENV = {"PATH": os.defpath}


def _spec(command: str, **more: Any) -> dict[str, Any]:
    return {"argv": ["/bin/sh", "-c", command], "cwd": "/", "env": ENV, "deadline_ms": 20_000,
            **more}


def test_a_search_that_has_answered_is_no_commands_leftover(tmp_path: Path) -> None:
    (tmp_path / "hay.txt").write_text("a needle\n")
    agent = AgentProcess(code=_PINNED_AND_LINGERING)
    try:
        found = agent.ok("grep", args={"base": str(tmp_path), "path": str(tmp_path),
                                         "confine": True, "pattern": "needle"})
        assert found, found
        status = agent.ok("start", job="after", spec=_spec("cat /dev/null; exit 7"),
                          wait_ms=10_000)
        assert status["exit_code"] == 7
        assert "leftovers_killed" not in status, status
    finally:
        agent.kill()


def test_a_call_ending_leaves_a_later_calls_escapee_alone(tmp_path: Path) -> None:
    """Call A runs; call B starts and leaves an orphan with no job token (a double fork,
    ``env -i``, ``setsid``); A ends while B runs. A reports nothing and kills nothing; B's end kills its
    own escapee and says so."""
    agent = AgentProcess(code=_PINNED_AND_LINGERING)
    pid_file = tmp_path / "escapee.pid"
    try:
        first = agent.send("start", job="A", spec=_spec("sleep 0.5"), wait_ms=10_000)
        second = agent.send("start", job="B", spec=_spec(
            f"(env -i setsid sleep 60 >/dev/null 2>&1 & echo $! > {pid_file}); sleep 1.5; echo end"),
            wait_ms=10_000)
        a = agent.answer(first)["result"]
        assert a["exit_code"] == 0 and "leftovers_killed" not in a, a
        escapee = int(pid_file.read_text())
        os.kill(escapee, 0)  # A's end left it alive
        b = agent.answer(second)["result"]
        assert b["exit_code"] == 0 and b.get("leftovers_killed") == 1, b
        assert b["chunks"] == [["stdout", "end\n"]], b  # B lived to its end
        deadline = time.monotonic() + 5
        while _alive(escapee) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(escapee)
    finally:
        agent.kill()
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_command_that_kills_its_root_still_gets_an_answer() -> None:
    """A command may kill its root (its parent): the leader, re-parented to the agent, is
    reaped by the agent, the call answers, and the next call gets a new root."""
    agent = AgentProcess()
    try:
        status = agent.ok("start", job="k", spec=_spec("sleep 0.2; kill -9 $PPID; sleep 0.1; exit 3"),
                          wait_ms=10_000)
        assert status["exit_code"] == 3, status
        again = agent.ok("start", job="next", spec=_spec("echo fine"), wait_ms=10_000)
        assert again["chunks"] == [["stdout", "fine\n"]], again
    finally:
        agent.kill()


def test_a_root_killed_as_its_leader_ends_still_gives_the_status() -> None:
    """The leader kills its root and exits before the root runs again (`kill -9 -1` on a
    busy machine; forced here: the root waits at idle priority on the leader's CPU), so the
    root wakes with the leader's exit AND a SIGKILL pending. A root that reaped there took the
    status to its death, and the call hung until its deadline (the rehearsal's 60 s
    `test_kill_minus_one_spares_the_session`); it now only looks (WNOWAIT), dies, and the agent
    reaps the leader with its status. Each round failed about 2 times in 3 before the fix."""
    agent = AgentProcess()
    try:
        for round_ in range(6):
            status = agent.ok("start", job=f"r{round_}", spec=_spec(
                "r=$PPID; taskset -pc 0 $$ >/dev/null; taskset -pc 0 $r >/dev/null; "
                "chrt -i -p 0 $r; kill -9 $r; echo after; exit 5", deadline_ms=15_000),
                wait_ms=20_000)
            assert not status.get("timed_out") and status["exit_code"] == 5, (round_, status)
            assert status["chunks"] == [["stdout", "after\n"]], (round_, status)
    finally:
        agent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False
