"""The job table under random interleavings (issue 19): detaching calls, waits, kills, job
listings, the end of a turn and close, run concurrently in random groups with random small
delays, on the host and on a container engine. After every group: no call raised, at most
``max_jobs`` jobs run, and every live process of the session is a running job of the table;
after ``end_turn`` only kept jobs live; after ``close`` nothing does (checked on the machine's
real process list)."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolseam import Toolkit, ToolResult
from toolseam.policy.settings import Settings
from toolseam.seam.errors import HostError

from ..support.engines import backend, remove_shared, shared_dir
from ..support.processes import host_survivors
from ..support.stdio import RawServer

MAX_JOBS = 3
_examples = itertools.count()

Action = tuple[Any, ...]
actions = st.one_of(
    st.tuples(st.just("run"), st.sampled_from(["long", "long", "short", "quick"]), st.booleans()),
    st.tuples(st.just("wait"), st.integers(0, 20), st.booleans()),
    st.tuples(st.just("kill"), st.integers(0, 20)),
    st.tuples(st.just("jobs")),
    st.tuples(st.just("end_turn")),
)
# A group runs at once; each action after its own delay (ms), so every order of arrival occurs.
groups = st.lists(st.lists(st.tuples(actions, st.integers(0, 40)), min_size=1, max_size=7),
                  min_size=1, max_size=5)


class Run:
    """One session driven through the public API, with the facts the invariants need."""

    def __init__(self, toolkit: Toolkit) -> None:
        self.toolkit = toolkit
        self.tag = f"{os.getpid() % 1000:03d}{next(_examples):04d}"
        self.count = itertools.count(1)
        self.marker_of: dict[int, str] = {}  # job id -> the marker its process line carries
        self.ids: list[int] = []
        self.closing = False  # after close, a call may answer that the sandbox is gone

    def live(self) -> set[str]:
        lines = host_survivors(f"sleep 600.{self.tag}")
        return {m for m in self.marker_of.values() if any(m in line for line in lines)} | (
            {"<untracked>"} if any(not any(m in line for m in self.marker_of.values())
                                   for line in lines) else set())

    async def act(self, action: Action, delay_ms: int) -> None:
        await asyncio.sleep(delay_ms / 1000)
        kind = action[0]
        if kind == "end_turn":
            killed = await self.toolkit.end_turn()
            gone = {self.marker_of[i] for i in killed}
            assert not gone & self.live(), f"end_turn reported {killed} killed, still alive"
            return
        if kind == "run":
            marker = f"600.{self.tag}{next(self.count):03d}"
            command = {"long": f"sleep {marker}", "short": f"sleep {marker} & sleep 0.3; kill $!",
                       "quick": "echo quick"}[action[1]]
            result = await self.toolkit.call("bash", {"command": command, "keep": action[2]})
            self.check(result)
            job_id = result.metadata.get("jobId")
            if job_id is not None:
                self.marker_of[job_id] = marker
                self.ids.append(job_id)
            return
        if kind == "jobs" or not self.ids:
            self.check(await self.toolkit.call("bash", {"jobs": True}))
            return
        job_id = self.ids[action[1] % len(self.ids)]
        if kind == "wait":
            args: dict[str, Any] = {"wait": job_id, "timeout": 30}
            if action[2]:
                args["keep"] = True
            self.check(await self.toolkit.call("bash", args))
        else:
            self.check(await self.toolkit.call("bash", {"kill": job_id}))

    def check_table(self) -> None:
        running = self.toolkit.services.jobs.running()
        assert len(running) <= MAX_JOBS, [j.id for j in running]
        allowed = {self.marker_of[j.id] for j in running}
        assert self.live() <= allowed, (self.live(), allowed)

    def check(self, result: ToolResult) -> None:
        """A call's answer: a result, never an exception; before close, an error only as a
        command's own end (a wait sees its job killed by a concurrent kill); after it, a
        command killed by the close or a sandbox that is gone is the right answer too."""
        assert isinstance(result, ToolResult)
        if result.is_error and not self.closing:
            assert "exitCode" in result.metadata, result.output


async def drive(toolkit: Toolkit, plan: list[list[tuple[Action, int]]], close_early: bool) -> None:
    run = Run(toolkit)
    await toolkit.open()
    try:
        for group in plan[:-1] if close_early else plan:
            await asyncio.gather(*(run.act(action, delay) for action, delay in group))
            run.check_table()
        if not close_early:
            killed = set(await toolkit.end_turn())
            kept = {run.marker_of[j.id] for j in toolkit.services.jobs.running() if j.keep}
            assert run.live() <= kept
            assert not {run.marker_of[i] for i in killed} & run.live()
            return
        # close while the last group's calls are in flight: a call may answer that the session
        # closed (a host error or a could-not-run result), but nothing it started survives
        calls: list[Awaitable[None]] = [run.act(action, delay) for action, delay in plan[-1]]
        tasks = [asyncio.ensure_future(c) for c in calls]
        await asyncio.sleep(0.05)
        run.closing = True
        await toolkit.close()
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            assert outcome is None or isinstance(outcome, HostError), outcome
    finally:
        await toolkit.close()
        deadline = time.monotonic() + 2  # the sandbox's close is synchronous; 2 s for /proc
        while run.live() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert run.live() == set(), "a process survived close"


def _settings(timeout_ms: int) -> Settings:
    return Settings(timeout_policy="detach", default_timeout_ms=timeout_ms, max_jobs=MAX_JOBS,
                    kill_grace_ms=200)


@given(plan=groups, close_early=st.booleans())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_job_table_invariants_on_the_host(plan: list[list[tuple[Action, int]]],
                                         close_early: bool, tmp_path_factory: pytest.TempPathFactory
                                         ) -> None:
    base = tmp_path_factory.mktemp("jobs")
    toolkit = Toolkit("host", base_dir=str(base), settings=_settings(100))
    asyncio.run(drive(toolkit, plan, close_early))


@pytest.mark.engines  # needs an engine without naming it in a parameter
@given(plan=groups, close_early=st.booleans())
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_job_table_invariants_in_a_container(plan: list[list[tuple[Action, int]]],
                                            close_early: bool) -> None:
    workspace = shared_dir()
    try:
        toolkit = Toolkit(backend("docker", str(workspace)), settings=_settings(300))
        asyncio.run(drive(toolkit, plan, close_early))
    finally:
        remove_shared(workspace)


@pytest.mark.parametrize("engine", ["host", "docker"])
async def test_six_detaching_calls_at_once_hold_max_jobs(engine: str, tmp_path: Path) -> None:
    """The reported case: six calls detach at once with max_jobs 3 — six answers, three jobs
    running (the last three), three processes alive, none after end_turn."""
    workspace = shared_dir() if engine == "docker" else tmp_path
    sandbox: Any = "host" if engine == "host" else backend("docker", str(workspace))
    toolkit = Toolkit(sandbox, base_dir=str(tmp_path) if engine == "host" else None,
                      settings=_settings(300))
    run = Run(toolkit)
    try:
        async with toolkit:
            await asyncio.gather(*(run.act(("run", "long", False), 0) for _ in range(6)))
            assert len(run.ids) == 6
            running = toolkit.services.jobs.running()
            assert [j.id for j in running] == sorted(run.ids)[3:]
            assert run.live() == {run.marker_of[j.id] for j in running}
            assert sorted(await toolkit.end_turn()) == sorted(run.ids)[3:]
            assert run.live() == set()
    finally:
        if engine == "docker":
            remove_shared(workspace)


def test_six_detaching_calls_over_serve_stdio_each_get_an_answer(tmp_path: Path) -> None:
    """Over ``serve --stdio`` a call that raised was never answered and the client hung."""

    config = tmp_path / "settings.json"
    config.write_text('{"timeout_policy": "detach", "default_timeout_ms": 200, "max_jobs": 3}')
    marker = f"600.{os.getpid() % 1000:03d}9"
    with RawServer("--base-dir", str(tmp_path), "--config", str(config)) as server:
        for n in range(6):
            server.send({"id": n, "tool": "bash", "args": {"command": f"sleep {marker}{n}"}})
        answers = [server.answer() for _ in range(6)]
        assert sorted(a["id"] for a in answers) == list(range(6))
        assert all(a["result"]["metadata"]["detached"] for a in answers), answers
        alive = {line.split("sleep ")[-1] for line in host_survivors(f"sleep {marker}")}
        assert alive == {f"{marker}{n}" for n in (3, 4, 5)}  # the three newest
        server.send({"op": "end_turn"})
        assert sorted(server.answer()["killed_jobs"]) == [4, 5, 6]
        assert host_survivors(f"sleep {marker}") == []
        assert server.close() == 0
