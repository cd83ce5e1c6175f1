"""Whose process is it, under load (issue 45, decision 345): on every backend at once, 64 calls
at a time start and end at random (0-5 ms apart) for ``TOOLSEAM_OWNERSHIP_STRESS_S`` seconds
(20 by default, to fit the suite's budget; 60 is the issue's full run), a quarter of them
leaving a process behind in each way a command can shed its parent (``setsid``, a double fork,
``set -m``, ``env -i``, a forged job token), some of them grep and glob calls (the agent's own
helpers), with a CPU hog on both cores. Every call:

* says what it did and nothing else: a plain call ends with its own ``end.N`` line (it lived to
  write it), exit 0 and no ``leftoversKilled`` (the "left running" line a model reads is made
  from that count alone, ``builtins/bash.py``) — so no other call's end killed it or claimed
  its process;
* that left one process behind is told exactly 1: its own end killed its own escapee, no other
  call did;

and after all of them not one escapee is alive in the sandbox.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from toolseam import Toolkit, ToolResult
from toolseam.policy.settings import Settings

from ..support.engines import EVERY_BACKEND, backend, remove_shared, shared_dir

DURATION_S = float(os.environ.get("TOOLSEAM_OWNERSHIP_STRESS_S", "20"))
AT_ONCE = 64
ESCAPES = {  # one process each, outliving the command's shell
    "setsid": "setsid sleep {m}{out} &",
    "double-fork": "(sleep {m}{out} &)",
    "set-m": "set -m 2>/dev/null; sleep {m}{out} &",
    "env-i": "env -i sleep {m}{out} &",
    "forged-token": "TOOLSEAM_JOB_TOKEN=forged setsid sleep {m}{out} &",
    "setsid-double-fork": "(setsid sleep {m}{out} &)",
}


class Tally:
    """What one backend's calls did, and every way one of them went wrong."""

    def __init__(self, name: str, tag: str) -> None:
        self.name, self.tag = name, tag
        self.calls: dict[str, int] = {}
        self.wrong: list[str] = []
        self.number = 0

    def next(self) -> int:
        self.number += 1
        return self.number

    def count(self, kind: str) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1


def _plain(result: ToolResult, number: int) -> str | None:
    """What is wrong with a plain call's result (None: nothing)."""
    if result.is_error or result.output != f"end.{number}\n":
        return f"plain call {number} did not live to its end: {result.output!r}"
    if "leftoversKilled" in result.metadata:
        return f"plain call {number} was told it left {result.metadata['leftoversKilled']}"
    return None


def _escaped(result: ToolResult, number: int, kind: str) -> str | None:
    killed = result.metadata.get("leftoversKilled")
    if result.is_error or not result.output.startswith(f"end.{number}\n"):
        return f"{kind} call {number} did not live to its end: {result.output!r}"
    if killed != 1:
        return f"{kind} call {number} was told {killed} (not 1) of its own: {result.output!r}"
    return None


async def _one_call(tk: Toolkit, tally: Tally, rng: random.Random) -> None:
    number = tally.next()
    pick = rng.random()
    work = f"sleep 0.0{rng.randrange(10):d}{rng.randrange(10):d}"
    if pick < 0.10:
        result = await tk.call("grep", {"pattern": "needle"})
        tally.count("grep")
        if result.is_error or "needle" not in result.output:
            tally.wrong.append(f"grep {number}: {result.output!r}")
    elif pick < 0.20:
        result = await tk.call("glob", {"pattern": "**/*.txt"})
        tally.count("glob")
        if result.is_error or "hay/a.txt" not in result.output:
            tally.wrong.append(f"glob {number}: {result.output!r}")
    elif pick < 0.45:  # a quarter of the bash calls and a little more leave a process behind
        kind = rng.choice(sorted(ESCAPES))
        out = rng.choice(["", " >/dev/null 2>&1"])  # holding the output pipe, or not
        marker = f"600.{tally.tag}{number}"
        command = f"{ESCAPES[kind].format(m=marker, out=out)}\n{work}\necho end.{number}"
        result = await tk.call("bash", {"command": command, "timeout": 60_000})
        tally.count(kind)
        problem = _escaped(result, number, kind)
        if problem:
            tally.wrong.append(problem)
    else:
        result = await tk.call("bash", {"command": f"{work}; echo end.{number}",
                                        "timeout": 60_000})
        tally.count("plain")
        problem = _plain(result, number)
        if problem:
            tally.wrong.append(problem)


async def _caller(tk: Toolkit, tally: Tally, rng: random.Random, until: float) -> None:
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(0, 0.005))
        await _one_call(tk, tally, rng)


async def _survivors(tk: Toolkit, tag: str) -> str:
    """Escapees still alive in the sandbox (their markers), from inside it."""
    found = await tk.call("bash", {"command": "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"
                                              f" | grep -o 'sleep 600[.]{tag}[0-9]*' || true",
                                   "timeout": 60_000})
    return found.output.strip()


async def _drive(name: str, seed: int, base: Path) -> Tally:
    tally = Tally(name, f"{seed % 1000:03d}")
    workspace = shared_dir() if name != "host" else base / name
    workspace.mkdir(exist_ok=True)
    sandbox: Any = "host" if name == "host" else backend(name, str(workspace))
    tk = Toolkit(sandbox, base_dir=str(workspace) if name == "host" else None,
                 settings=Settings(default_timeout_ms=60_000))
    try:
        async with tk:
            await tk.call("write", {"path": "hay/a.txt", "content": "a needle\n"})
            until = time.monotonic() + DURATION_S
            rngs = [random.Random(seed * 1000 + n) for n in range(AT_ONCE)]
            await asyncio.gather(*(_caller(tk, tally, rng, until) for rng in rngs))
            left = await _survivors(tk, tally.tag)
            if left:
                tally.wrong.append(f"escapees alive after their calls: {left}")
    finally:
        if name != "host":
            remove_shared(workspace)
    return tally


@pytest.mark.engines  # every engine, in one test: they run at once to fit the suite's time
def test_no_call_kills_or_claims_another_calls_process(tmp_path: Path) -> None:
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    seed = random.randrange(1 << 30)
    try:
        async def every_backend() -> list[Tally]:
            return list(await asyncio.gather(*(_drive(name, seed, tmp_path)
                                               for name in EVERY_BACKEND)))
        tallies = asyncio.run(every_backend())
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    report = {t.name: t.calls for t in tallies}
    wrong = {t.name: (len(t.wrong), t.wrong[:4]) for t in tallies if t.wrong}
    if wrong:
        pytest.fail(f"seed {seed}: {wrong}; calls {report}", pytrace=False)
    for tally in tallies:  # every kind of call ran on every backend
        assert {"plain", "grep", "glob", *ESCAPES} <= set(tally.calls), (tally.name, tally.calls)
