"""The floor of a supervising process: the real agent against a minimal loop, in ONE run.

    python benchmarks/agent_floor.py [CALLS] [--against REV]

Four contenders, measured in alternating blocks: a bare ``subprocess.run(["sh", "-c",
"true"])``; the agent (``toolseam_agent``, staged and started as the host backend starts it,
without the namespaces) sent a ``start`` request by a raw JSON-lines client; a minimal loop
that does only what any supervising process must — read a request, parse it, spawn the
command with the agent's own ``posix_spawn`` arguments, wait for both pipes' EOF, reap it,
answer; and a flat loop that does the agent's own per-command work for a quiet command in one
function (``flat_loop``). Each supervisor's CPU per call is read from ``/proc``. The minimal
loop against bare is what the hop itself costs (docs/decisions.md, 120), the flat loop against
the minimal one what the agent's work costs, the agent against the flat loop what its
structure costs (decision 140). ``--against REV`` adds the agent of a git revision: an A/B of
two agents in one run (decision 124).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from toolseam.backends.agentlink.launch import agent_command, stage_agent
from toolseam_agent.jobs import oom_counters

_ALL_SIGNALS = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}


def minimal_loop(fd: int) -> None:
    """The least a supervisor does per command (the agent's spawn arguments, no bookkeeping)."""
    poller = select.epoll()
    poller.register(fd, select.EPOLLIN)
    env: dict[str, str] = {}
    while True:
        poller.poll()
        data = os.read(fd, 1 << 16)
        if not data:
            return
        request = json.loads(data)
        env = request["spec"].get("env", env)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                   (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]
        argv = request["spec"]["argv"]
        pid = os.posix_spawn(argv[0], argv, env, file_actions=actions, setsid=True,
                             setsigdef=_ALL_SIGNALS, setsigmask=())
        os.close(out_w)
        os.close(err_w)
        open_pipes = {out_r, err_r}
        for pipe in open_pipes:
            poller.register(pipe, select.EPOLLIN)
        while open_pipes:
            for ready, _ in poller.poll():
                if ready in open_pipes and not os.read(ready, 1 << 16):
                    poller.unregister(ready)
                    os.close(ready)
                    open_pipes.discard(ready)
        _, status = os.waitpid(pid, 0)
        answer = {"id": request["id"], "ok": True, "result": {
            "pid": pid, "state": "exited", "exit_code": os.waitstatus_to_exitcode(status)}}
        os.write(fd, (json.dumps(answer) + "\n").encode())


def flat_loop(fd: int) -> None:
    """The minimal loop doing the agent's own per-command work, written flat: the job token in
    the environment, non-blocking pipes watched before the spawn, the exit by pidfd with the
    write ends held until then, the OOM counter read before and after, the one-``waitid``
    "no child left" check, the agent's status fields. What it costs over the minimal loop is
    the work; what the agent costs over it is the agent's structure (decision 140)."""
    poller = select.epoll()
    poller.register(fd, select.EPOLLIN)
    env: dict[str, str] = {}
    for number in itertools.count(1):
        poller.poll()
        data = os.read(fd, 1 << 16)
        if not data:
            return
        request = json.loads(data)
        spec = request["spec"]
        env = spec.get("env", env)
        env["TOOLSEAM_JOB_TOKEN"] = f"flat-{number}"
        pipes = [os.pipe(), os.pipe()]
        for read_end, _ in pipes:
            os.set_blocking(read_end, False)
            poller.register(read_end, select.EPOLLIN)
        actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                   (os.POSIX_SPAWN_DUP2, pipes[0][1], 1), (os.POSIX_SPAWN_DUP2, pipes[1][1], 2)]
        started, t0 = time.time(), time.monotonic()
        pid = os.posix_spawn(spec["argv"][0], spec["argv"], env, file_actions=actions,
                             setsid=True, setsigdef=_ALL_SIGNALS, setsigmask=())
        pidfd = os.pidfd_open(pid)
        poller.register(pidfd, select.EPOLLIN)
        oom_before = oom_counters()
        while all(ready != pidfd for ready, _ in poller.poll()):
            pass  # a quiet command: nothing comes before its exit
        _, status = os.waitpid(pid, 0)
        poller.unregister(pidfd)
        os.close(pidfd)
        for read_end, write_end in pipes:
            os.close(write_end)
            os.read(read_end, 1 << 16)  # the EOF
            poller.unregister(read_end)
            os.close(read_end)
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        result = {"job": request["job"], "pid": pid, "state": "exited", "started": started,
                  "duration_ms": int((time.monotonic() - t0) * 1000),
                  "exit_code": os.waitstatus_to_exitcode(status)}
        if oom_counters() != oom_before:
            result["oom_killed"] = True
        os.write(fd, (json.dumps({"id": request["id"], "ok": True, "result": result})
                      + "\n").encode())


def _cpu_seconds(pid: int) -> float:
    """The supervisor's own CPU: the process and its job roots (decision 345: live children
    that start the commands; their commands' CPU, in a root's reaped-children figure, is not)."""
    ticks = 0
    for one in [pid, *_children(pid)]:
        try:
            with open(f"/proc/{one}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            return [int(child) for child in children.read().split()]
    except OSError:
        return []


def _agent_at(revision: str, into: str) -> list[str]:
    """The agent of a git revision of this checkout, run as the staged one is (an A/B of two
    agents in one run: the wire's start request is the same in both protocols)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = subprocess.run(["git", "-C", repo, "archive", revision, "toolseam_agent"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    with open(os.path.join(into, "__main__.py"), "w") as main_py:
        main_py.write("from toolseam_agent.main import main\n\nmain()\n")
    return [sys.executable, *agent_command(into)]


def main(calls: int, against: str | None = None) -> None:
    staged = stage_agent()
    commands = {"agent": [sys.executable, *agent_command(staged)],
                "flat, the agent's work": [sys.executable, __file__, "--flat"],
                "minimal": [sys.executable, __file__, "--minimal"]}
    old_agent = tempfile.TemporaryDirectory(prefix="toolseam-agent-ab-")
    if against is not None:
        commands[f"agent@{against}"] = _agent_at(against, old_agent.name)
    peers: dict[str, tuple[socket.socket, Any, subprocess.Popen[bytes]]] = {}
    for name, command in commands.items():
        ours, theirs = socket.socketpair()
        process = subprocess.Popen(command, stdin=theirs.fileno(), stdout=theirs.fileno())
        theirs.close()
        peers[name] = (ours, ours.makefile("rb"), process)
    env, ids = dict(os.environ), iter(range(1 << 62))

    def agent_call(name: str) -> None:
        sock, answers, _ = peers[name]
        spec = {"argv": ["/bin/sh", "-c", "true"], "cwd": os.getcwd(), "deadline_ms": 60_000,
                "grace_ms": 2000, "stream": False, "output_limit": 1 << 20, "env_id": 1}
        rid = next(ids)
        if rid < len(peers):
            spec["env"] = env  # the first request of each peer carries the environment
        sock.sendall((json.dumps({"id": rid, "op": "start", "job": f"j{rid}", "spec": spec,
                                  "forget": True}) + "\n").encode())
        if not json.loads(answers.readline()).get("ok"):
            raise RuntimeError(f"{name}: the call failed")

    contenders: dict[str, Callable[[], object]] = {
        "bare": lambda: subprocess.run(["sh", "-c", "true"], check=True),
        **{name: functools.partial(agent_call, name) for name in peers}}
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    cpu = {name: 0.0 for name in peers}
    for name in peers:
        agent_call(name)  # the environment, once
    block = 20
    for _ in range(max(1, calls // block)):
        for name, call in contenders.items():
            before = _cpu_seconds(peers[name][2].pid) if name in peers else 0.0
            for _ in range(block):
                started = time.perf_counter()
                call()
                samples[name].append(time.perf_counter() - started)
            if name in peers:
                cpu[name] += _cpu_seconds(peers[name][2].pid) - before
    bare = statistics.median(samples["bare"])
    print("| per `sh -c true` | p50 µs | vs bare | supervisor CPU per call, µs |")
    print("|---|---:|---:|---:|")
    for name in contenders:
        p50 = statistics.median(samples[name])
        own = f"{cpu[name] / len(samples[name]) * 1e6:.0f}" if name in cpu else "—"
        print(f"| {name} | {p50 * 1e6:.0f} | {p50 / bare:.2f}x | {own} |")
    for sock, answers, process in peers.values():
        answers.close()
        sock.close()
        process.wait(10)
    old_agent.cleanup()


if __name__ == "__main__":
    if sys.argv[1:] == ["--minimal"]:
        minimal_loop(sys.stdin.fileno())
    elif sys.argv[1:] == ["--flat"]:
        flat_loop(sys.stdin.fileno())
    else:
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("calls", nargs="?", type=int, default=3000)
        parser.add_argument("--against", metavar="REV",
                            help="also the agent of this git revision (an A/B in one run)")
        options = parser.parse_args()
        main(options.calls, options.against)
