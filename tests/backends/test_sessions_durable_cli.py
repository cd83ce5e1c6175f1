"""``toolseam serve --stdio --detach-on-eof`` and ``--attach FILE``, as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ..support.engines import IMAGE, remove_shared, shared_dir

REPO = Path(__file__).resolve().parents[2]
TOOLSEAM = [sys.executable, "-m", "toolseam.frontends.cli", "serve", "--stdio"]
# long enough that the attach below finds it still running on a loaded machine (an ended
# job is not adopted: docs/sessions.md)
COMMAND = "for i in $(seq 1 15); do echo line-$i; sleep 0.5; done"


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_detach_on_eof_then_attach_from_a_new_process(tmp_path: Path) -> None:
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"timeout_policy": "detach", "default_timeout_ms": 60_000}))
    work = tmp_path / "work"
    work.mkdir()
    server = subprocess.Popen([*TOOLSEAM, "--detach-on-eof", "--orphan-timeout", "30",
                               "--config", str(config), "--base-dir", str(work)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert server.stdin is not None and server.stdout is not None
    handle_line = json.loads(server.stdout.readline())
    assert handle_line["op"] == "handle"
    server.stdin.write(json.dumps({"id": 1, "tool": "write",
                                   "args": {"path": "a.txt", "content": "before"}}) + "\n")
    server.stdin.write(json.dumps({"id": 2, "tool": "bash", "args": {"command": COMMAND}}) + "\n")
    server.stdin.flush()
    assert json.loads(server.stdout.readline())["id"] == 1
    server.stdin.close()  # EOF with the bash call in flight
    rest = _lines(server.stdout.read())
    server.stdout.close()
    assert server.wait(timeout=30) == 0
    assert rest[0]["id"] == 2 and rest[0]["error"]["code"] == "DETACHED"
    assert rest[-1]["op"] == "detached"  # no "closed": the session goes on
    handle_file = tmp_path / "handle.json"
    handle_file.write_text(json.dumps(handle_line))
    requests = [{"id": 1, "tool": "bash", "args": {"jobs": True}},
                {"id": 2, "tool": "bash", "args": {"wait": 1, "timeout": 20_000}},
                {"id": 3, "tool": "read", "args": {"path": "a.txt"}}]  # then EOF: close
    attached = subprocess.run([*TOOLSEAM, "--attach", str(handle_file)], cwd=REPO,
                              input="".join(json.dumps(r) + "\n" for r in requests),
                              capture_output=True, text=True, timeout=60)
    assert attached.returncode == 0, attached.stderr
    answers = {a.get("id"): a for a in _lines(attached.stdout)}
    assert "result" in answers[1], answers
    assert "line-" in answers[1]["result"]["output"]  # the call in flight, now job 1
    assert answers[2]["result"]["output"] == "".join(f"line-{i}\n" for i in range(1, 16))
    assert "before" in answers[3]["result"]["output"]
    assert not os.path.exists(handle_line["handle"]["socket"])  # closed: nothing left


def test_attach_refusals_from_the_command_line(tmp_path: Path) -> None:
    missing = subprocess.run([*TOOLSEAM, "--attach", str(tmp_path / "nope")], cwd=REPO,
                             input="", capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    detach = subprocess.run([*TOOLSEAM, "--detach-on-eof"], cwd=REPO, input="",
                            capture_output=True, text=True, timeout=60)
    assert detach.returncode == 2 and "orphan_timeout_s" in detach.stderr
    both = tmp_path / "h.json"
    both.write_text("{}")
    mixed = subprocess.run([*TOOLSEAM, "--attach", str(both), "--base-dir", "/tmp"], cwd=REPO,
                           input="", capture_output=True, text=True, timeout=60)
    assert mixed.returncode == 2 and "--base-dir" in mixed.stderr


def _serve_and_close_at_once(work: Path, extra: list[str], requests: list[dict[str, Any]]
                             ) -> list[dict[str, Any]]:
    """Every request piped in and stdin closed at once (issue 33, item 1)."""
    done = subprocess.run([*TOOLSEAM, "--detach-on-eof", "--orphan-timeout", "60",
                           "--base-dir", str(work), *extra], cwd=REPO,
                          input="".join(json.dumps(r) + "\n" for r in requests),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return _lines(done.stdout)


@pytest.mark.parametrize("engine", ["host", "docker"])
@pytest.mark.parametrize("policy", ["detach", "kill"])
def test_every_line_read_before_eof_is_answered_with_what_really_happened(
        engine: str, policy: str, tmp_path: Path) -> None:
    """A write and a short bash piped in with a pipe that closes at once both ran (they were
    answered DETACHED and never ran before); a long command is DETACHED and goes on as a job
    the next attach finds; the message is true for the policy."""
    work = tmp_path / "work" if engine == "host" else shared_dir()
    work.mkdir(exist_ok=True)
    extra = [] if engine == "host" else ["--backend", "docker", "--image", IMAGE]
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"timeout_policy": policy, "default_timeout_ms": 60_000}))
    try:
        lines = _serve_and_close_at_once(work, [*extra, "--config", str(config)], [
            {"id": 1, "tool": "write", "args": {"path": "a.txt", "content": "written"}},
            {"id": 2, "tool": "bash", "args": {"command": "echo ran > b.txt; echo ok"}},
            {"id": 3, "tool": "bash", "args": {"command": "sleep 30; echo late > c.txt"}}])
        answers = {line.get("id"): line for line in lines if "id" in line}
        assert "result" in answers[1], answers  # a file op finishes before the detach
        short = answers[2].get("result") or answers[2]["error"]
        assert short.get("output") == "ok\n" or short.get("code") == "DETACHED", answers
        assert answers[3]["error"]["code"] == "DETACHED"
        assert ("jobs" in answers[3]["error"]["message"]) is (policy == "detach")
        assert (work / "a.txt").read_text() == "written"
        handle = next(line for line in lines if line.get("op") == "detached")
        handle_file = tmp_path / "handle.json"
        handle_file.write_text(json.dumps(handle))
        requests = [{"id": 1, "tool": "bash", "args": {
            "command": "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"}}]
        if policy == "detach":
            requests.append({"id": 2, "tool": "bash", "args": {"jobs": True}})
        attached = subprocess.run([*TOOLSEAM, "--attach", str(handle_file)], cwd=REPO,
                                  input="".join(json.dumps(r) + "\n" for r in requests),
                                  capture_output=True, text=True, timeout=60)
        after = {a.get("id"): a for a in _lines(attached.stdout)}
        assert "sleep 30" in after[1]["result"]["output"]  # the long command did start
        assert (work / "b.txt").read_text() == "ran\n"  # the short one ran, whatever it answered
        if policy == "detach":
            assert "sleep 30" in after[2]["result"]["output"]
    finally:
        if engine != "host":
            remove_shared(work)


def test_a_call_that_never_reached_the_sandbox_says_so(scratch: Path) -> None:
    """A call waiting on a question nobody can answer any more (stdin closed) is answered
    with the question denied — never "goes on as a job"."""
    outside = scratch / "outside.txt"  # not a temp dir: those are always in scope
    outside.write_text("secret")
    work = scratch / "work"
    work.mkdir()
    config = scratch / "settings.json"
    config.write_text(json.dumps({"read_scope": "working-dir"}))
    done = subprocess.run(
        [*TOOLSEAM, "--detach-on-eof", "--orphan-timeout", "60", "--base-dir", str(work),
         "--approvals", "--config", str(config)], cwd=REPO, input=json.dumps(
             {"id": 1, "tool": "read", "args": {"path": str(outside)}}) + "\n",
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = _lines(done.stdout)
    answer = next(line for line in lines if line.get("id") == 1)
    assert "DETACHED" not in json.dumps(answer) and "secret" not in json.dumps(answer)
    assert answer["result"]["metadata"] == {"refused": True}
