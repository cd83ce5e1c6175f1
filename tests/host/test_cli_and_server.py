"""The command line and the stdio server, run as real subprocesses."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import psutil

from ..support.cli import Server, run
from ..support.processes import host_survivors

TOOLSEAM = [sys.executable, "-m", "toolseam.frontends.cli"]


def test_call_prints_one_json_result(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("hello\n")
    done = run("call", "read", '{"path": "f.txt"}', "--base-dir", str(tmp_path), "--confine")
    assert done.returncode == 0
    answer = json.loads(done.stdout)
    assert answer["output"] == "00001| hello\n\n(end of file, 1 line)"
    assert answer["is_error"] is False and answer["metadata"]["bytes"] == 6
    refused = run("call", "read", '{"path": "../x"}', "--base-dir", str(tmp_path), "--confine")
    assert refused.returncode == 1 and json.loads(refused.stdout)["is_error"] is True


def test_host_errors_exit_non_zero_with_a_message(tmp_path: Path) -> None:
    unknown = run("call", "webfetch", "{}", "--base-dir", str(tmp_path))
    assert unknown.returncode == 2 and "unknown tool 'webfetch'" in unknown.stderr
    bad_json = run("call", "read", "{nope", "--base-dir", str(tmp_path))
    assert bad_json.returncode == 2 and "JSON-ARGS is not valid JSON" in bad_json.stderr
    config = tmp_path / "c.toml"
    config.write_text("max_jobs = 0\n")
    bad_config = run("call", "read", "{}", "--config", str(config))
    assert bad_config.returncode == 2 and "max_jobs: Input should be greater than 0" in bad_config.stderr
    assert bad_config.stdout == ""


def test_tools_prints_declarations() -> None:
    for fmt, key in (("openai", "function"), ("anthropic", "input_schema"), ("gemini", "parameters"),
                     ("openai-strict", "function"), ("responses", "parameters")):
        done = run("tools", "--format", fmt)
        assert done.returncode == 0
        assert all(key in d for d in json.loads(done.stdout))


def test_demo_runs_and_leaves_nothing() -> None:
    done = run("demo")
    assert done.returncode == 0, done.stderr
    assert "Applied patch: 3 file operations" in done.stdout
    assert "bash: command timed out after 1500ms" in done.stdout
    assert done.stdout.rstrip().endswith("processes left from the timed-out job: none")


def test_the_demo_counts_only_its_own_leftovers() -> None:
    """Another demo's sleeps alive on the machine (a second worker running it at the same
    moment) are not this run's leftovers; the demo once counted every `sleep 4242`."""
    others = [psutil.Popen(["sleep", mark]) for mark in ("4242", "4243")]
    try:
        done = run("demo")
        assert done.returncode == 0, done.stdout[-800:]
        assert done.stdout.rstrip().endswith("processes left from the timed-out job: none")
        assert all(other.is_running() for other in others)
    finally:
        for other in others:
            other.kill()
            other.wait()


def test_serve_overlapping_calls_malformed_lines_and_close(tmp_path: Path) -> None:
    with Server("--base-dir", str(tmp_path), "--stream") as server:
        server.send({"id": "slow", "tool": "bash", "args": {"command": "sleep 0.5; echo slow"}})
        server.send({"id": 2, "tool": "write", "args": {"path": "a.txt", "content": "x"}})
        server.send("this is not json")
        server.send({"id": 3, "tool": "nope", "args": {}})
        messages = server.read_until(lambda m: m.get("id") == "slow" and "result" in m)
        by_id = {m.get("id"): m for m in messages if "result" in m or "error" in m}
        assert by_id[2]["result"]["output"] == "Wrote 1 bytes to a.txt"
        assert by_id[None]["error"]["code"] == "BAD_REQUEST"
        assert by_id[3]["error"]["code"] == "UNKNOWN_TOOL"
        assert by_id["slow"]["result"]["output"] == "slow\n"
        order = [m.get("id") for m in messages]
        assert order.index(2) < order.index("slow")  # the fast call did not wait for the slow one
        assert {"op": "output", "id": "slow", "stream": "stdout", "data": "slow\n"} in messages
        server.send({"op": "close"})
        assert server.read() == {"op": "closed"}
        assert server.finish() == 0


def test_serve_eof_finishes_the_calls_read_and_leaves_nothing(tmp_path: Path) -> None:
    """At EOF the calls already read are answered (``echo '{...}' | toolseam serve`` works),
    then the session closes and nothing it started survives."""
    marker = f"{os.getpid() % 1000 + 5000}.25"
    # this worker may hold other tests' toolseam processes (module fixtures): only new ones count
    before = {p.pid for p in psutil.Process().children()}
    with Server("--base-dir", str(tmp_path)) as server:
        server.send({"id": 1, "tool": "bash",
                     "args": {"command": f"(setsid sleep {marker} &); sleep 0.3; echo done"}})
        deadline = time.monotonic() + 5
        while not host_survivors(f"sleep {marker}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_survivors(f"sleep {marker}")
        assert server.proc.stdin is not None
        server.proc.stdin.close()
        messages = server.read_until(lambda m: m.get("op") == "closed")
        assert messages[0]["id"] == 1 and messages[0]["result"]["output"] == "done\n"
        assert server.finish() == 0
        assert host_survivors(f"sleep {marker}") == []
        assert _toolseam_children(before) == []


def _toolseam_children(before: set[int]) -> list[str]:
    """This process's live toolseam children not in ``before`` (one that ends meanwhile is not)."""
    found = []
    for child in psutil.Process().children():
        if child.pid in before:
            continue
        try:
            line = " ".join(child.cmdline())
            if "toolseam" in line and child.status() != psutil.STATUS_ZOMBIE:
                found.append(line)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def test_serve_end_turn_and_approvals(tmp_path: Path, scratch: Path) -> None:
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"timeout_policy": "detach", "default_timeout_ms": 200,
                                  "read_scope": "working-dir"}))
    work = scratch
    (work / "outside").mkdir(parents=True, exist_ok=True)
    (work / "outside" / "o.txt").write_text("outside\n")
    (work / "inside").mkdir(exist_ok=True)
    with Server("--base-dir", str(work / "inside"), "--config", str(config), "--approvals") as server:
        server.send({"id": 1, "tool": "bash", "args": {"command": "sleep 30"}})
        assert server.read()["result"]["metadata"]["detached"] is True
        server.send({"op": "end_turn"})
        assert server.read() == {"op": "end_turn", "killed_jobs": [1]}
        server.send({"id": 2, "tool": "read", "args": {"path": str(work / "outside" / "o.txt")}})
        ask = server.read()
        assert ask["op"] == "ask" and ask["path"] == str(work / "outside" / "o.txt")
        assert ask["workdir"] == str(work / "inside") and "directory" in ask["choices"]
        server.send({"op": "answer", "qid": ask["qid"], "answer": "once"})
        assert server.read() == {"op": "answered", "qid": ask["qid"]}
        assert server.read()["result"]["output"].startswith("00001| outside\n")
        server.send({"op": "answer", "qid": "99", "answer": "once"})
        assert server.read()["error"]["code"] == "BAD_REQUEST"
        server.send({"op": "close"})
        assert server.read() == {"op": "closed"}
        server.finish()


def test_serve_without_approvals_refuses(tmp_path: Path, scratch: Path) -> None:
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"read_scope": "working-dir"}))
    work = scratch
    (work / "base").mkdir(parents=True, exist_ok=True)
    (work / "named.txt").write_text("named\n")
    (work / "other.txt").write_text("other\n")
    with Server("--base-dir", str(work / "base"), "--config", str(config)) as server:
        server.send({"op": "user_message", "text": f"read {work / 'named.txt'} please"})
        assert server.read() == {"op": "noted"}
        server.send({"id": 1, "tool": "read", "args": {"path": str(work / "other.txt")}})
        refused = server.read()["result"]
        assert refused["is_error"] and refused["output"].startswith("read: ")
        assert "was not approved" in refused["output"]
        server.send({"id": 2, "tool": "read", "args": {"path": str(work / "named.txt")}})
        assert not server.read()["result"]["is_error"]
        server.send({"op": "close"})
        assert server.read() == {"op": "closed"}
        server.finish()
