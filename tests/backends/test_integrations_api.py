"""Strict OpenAI and Responses declarations, SyncToolkit, limits validation, the CLI's truth."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from agents.strict_schema import ensure_strict_json_schema
from openai.types.chat import ChatCompletionFunctionToolParam
from openai.types.responses import FunctionToolParam
from pydantic import TypeAdapter

from toolseam import ConfigurationError, SandboxLimits, Settings, SyncToolkit, Toolkit
from toolseam.builtins._base import MAX_TIMEOUT_MS
from toolseam.policy.settings import parse_settings
from toolseam.testing.fake import FakeBackend

from ..support.timing import patience

TOOLSEAM = [sys.executable, "-m", "toolseam.frontends.cli"]


def check_strict(schema: dict[str, Any], where: str = "") -> None:
    """OpenAI strict mode's rules, at every level."""
    if schema.get("type") == "object" or "properties" in schema:
        assert schema.get("additionalProperties") is False, where
        assert sorted(schema["required"]) == sorted(schema["properties"]), where
        for key, child in schema["properties"].items():
            check_strict(child, f"{where}.{key}")
    assert "default" not in schema, where


@pytest.mark.parametrize("policy", ["kill", "detach"])
def test_openai_strict_and_responses_declarations_validate(policy: str) -> None:
    tk = Toolkit(FakeBackend(), settings=Settings(timeout_policy=policy))  # type: ignore[arg-type]
    strict = tk.declarations("openai-strict")
    responses = tk.declarations("responses")
    assert [d["function"]["name"] for d in strict] == [d["name"] for d in responses] == tk.tool_names
    for chat, flat in zip(strict, responses, strict=True):
        TypeAdapter(ChatCompletionFunctionToolParam).validate_python(chat, strict=True)
        TypeAdapter(FunctionToolParam).validate_python(flat, strict=True)
        assert chat["function"]["strict"] is True and flat["strict"] is True
        schema = flat["parameters"]
        assert chat["function"]["parameters"] == schema
        check_strict(schema, flat["name"])
        assert ensure_strict_json_schema(json.loads(json.dumps(schema))) == schema
    read = next(d for d in responses if d["name"] == "read")["parameters"]["properties"]
    assert read["offset"] == {"type": ["integer", "null"], "minimum": 1,
                              "description": "First line to return, counting from 1."}
    bash = next(d for d in responses if d["name"] == "bash")["parameters"]["properties"]
    assert bash["timeout"]["type"] == ["integer", "null"]
    assert (bash["timeout"]["minimum"], bash["timeout"]["maximum"]) == (1, MAX_TIMEOUT_MS)


async def test_every_tool_takes_null_for_what_it_leaves_out(tmp_path: Path) -> None:
    """Strict mode makes the model send every property; null means "not given"."""
    (tmp_path / "f.txt").write_text("a\n")
    async with Toolkit("host", base_dir=str(tmp_path)) as tk:
        calls = {
            "bash": {"command": "echo ok", "workdir": None, "timeout": None, "description": None},
            "read": {"path": "f.txt", "offset": None, "limit": None},
            "edit": {"path": "f.txt", "oldString": "a", "newString": "b", "replaceAll": None},
            "grep": {"pattern": "b", "path": None, "include": None, "limit": None},
            "glob": {"pattern": "*.txt", "path": None, "limit": None},
        }
        for name, args in calls.items():
            result = await tk.call(name, args)
            assert not result.is_error, (name, result.output)


# --- SyncToolkit ----------------------------------------------------------------------------
def test_sync_toolkit_from_threads(tmp_path: Path) -> None:
    with SyncToolkit("host", base_dir=str(tmp_path)) as tk:
        results: dict[int, str] = {}

        def work(n: int) -> None:
            tk.call("write", {"path": f"{n}.txt", "content": str(n)})
            results[n] = tk.call("bash", {"command": f"cat {n}.txt"}).output

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == {n: str(n) for n in range(8)}
    with pytest.raises(Exception, match="closed"):
        tk.call("bash", {"command": "true"})


def test_sync_toolkit_inside_running_loops(tmp_path: Path) -> None:
    tk = SyncToolkit("host", base_dir=str(tmp_path))
    try:
        async def agent_turn() -> str:
            # a framework's sync tool, called straight from a coroutine on a running loop
            return tk.call("bash", {"command": "echo from-loop"}).output

        assert asyncio.run(agent_turn()) == "from-loop\n"
        assert asyncio.run(agent_turn()) == "from-loop\n"  # a second loop, same session
        assert tk.declarations("openai")[0]["function"]["name"] == "bash"
    finally:
        tk.close()
    assert not tk._thread.is_alive()  # the background loop stopped with the session


def test_sync_toolkit_bad_configuration_is_raised_at_once() -> None:
    with pytest.raises(ConfigurationError, match="confine_to_base_dir needs a base_dir"):
        SyncToolkit("host", confine_to_base_dir=True)
    assert not any(t.name == "toolseam-sync" for t in threading.enumerate())


# --- limits ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("data", "message"), [
    ({"memory": "lots"}, "limits.memory: 'lots' is not a size like 512m, 2g or 1048576"),
    ({"memory": "1m"}, "limits.memory: '1m' is below the 6m an engine accepts"),
    ({"cpus": 0}, "limits.cpus: Input should be greater than 0"),
    ({"pids": "64"}, "limits.pids: Input should be a valid integer"),
    ({"network": "host"}, "limits.network: Input should be 'none', 'bridge' or 'egress'"),
    ({"tmpfs_size": "-1"}, "limits.tmpfs_size: '-1' is not a size"),
    ({"swap": "1g"}, "unknown field 'limits.swap'"),
])
def test_limits_are_validated_naming_the_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_settings({"limits": data})
    assert message in str(caught.value)


def test_limits_need_a_container_backend() -> None:
    with pytest.raises(ConfigurationError, match="enforced by a container engine"):
        Toolkit("host", settings=Settings(limits=SandboxLimits(memory="256m")))


# --- the CLI --------------------------------------------------------------------------------
def run(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TOOLSEAM, *args], capture_output=True, text=True, timeout=60, **kw)


def test_version() -> None:
    from toolseam import __version__

    done = run("--version")
    assert (done.returncode, done.stdout) == (0, f"toolseam {__version__}\n")


def test_call_exit_codes(tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("x\n")
    base = ["--base-dir", str(tmp_path)]
    ok = run("call", "bash", '{"command": "true"}', *base)
    failed = run("call", "bash", '{"command": "exit 5"}', *base)
    down = run("call", "read", '{"path": "f.txt"}', "--backend", "docker", "--workspace",
               str(tmp_path), env={**os.environ, "TOOLSEAM_DOCKER_URL": "unix:///nonexistent.sock"})
    assert (ok.returncode, failed.returncode, down.returncode) == (0, 1, 3)
    assert json.loads(failed.stdout)["metadata"]["exitCode"] == 5
    assert json.loads(down.stdout)["metadata"]["failure"] == "could_not_run"
    for done in (ok, failed, down):
        assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["call", "read", '{"path": "x"}', "--confine"],
     "toolseam: --confine needs --base-dir (the directory to confine to)\n"),
    (["call", "read", "{nope"], "toolseam: JSON-ARGS is not valid JSON: "),
    (["call", "read", "{}", "--memory", "lots", "--backend", "docker"],
     "toolseam: settings: --memory: 'lots' is not a size like 512m, 2g or 1048576\n"),
    (["call", "read", "{}", "--pids", "many"],
     "toolseam: argument --pids: invalid int value: 'many' (see 'toolseam call --help')\n"),
    (["call", "nosuchtool", "{}"], "toolseam: unknown tool 'nosuchtool'"),
    (["frobnicate"], "toolseam: argument command: invalid choice: 'frobnicate'"),
    (["mcp", "--http", "nowhere"], "toolseam: --http takes HOST:PORT or unix:PATH, got 'nowhere'\n"),
])
def test_usage_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    done = run(*args)
    assert done.returncode == 2
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr


def test_serve_with_engine_down_is_one_line(tmp_path: Path) -> None:
    done = run("serve", "--stdio", "--backend", "docker", "--workspace", str(tmp_path),
               input="", env={**os.environ, "TOOLSEAM_DOCKER_URL": "unix:///nonexistent.sock"})
    assert done.returncode == 3
    assert done.stderr.startswith("toolseam: could not run: ") and done.stderr.count("\n") == 1


def test_ctrl_c_is_one_line(tmp_path: Path) -> None:
    process = subprocess.Popen([*TOOLSEAM, "serve", "--stdio", "--base-dir", str(tmp_path)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write('{"id": 1, "tool": "bash", "args": {"command": "true"}}\n')
    process.stdin.flush()
    assert json.loads(process.stdout.readline())["id"] == 1
    process.send_signal(signal.SIGINT)
    # stdin stays open until it has exited: an EOF read in the same loop pass as the signal's
    # wake-up ended the server in order (exit 0) once under load
    try:
        process.wait(timeout=patience(30))
    finally:
        _, err = process.communicate(timeout=patience(30))
    assert process.returncode == 130 and err == "toolseam: interrupted\n"


def test_ctrl_c_reaches_serve_whichever_thread_the_kernel_picks(tmp_path: Path) -> None:
    """The kernel gives a process's SIGINT to any of its threads: one given to a thread other
    than the main one left ``asyncio.run``'s loop asleep until stdin closed (CI, under load).
    Here each of serve's other threads gets one, by ``tgkill``: each ends it (130) at once."""
    libc = ctypes.CDLL(None, use_errno=True)
    process = subprocess.Popen([*TOOLSEAM, "serve", "--stdio", "--base-dir", str(tmp_path)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdin is not None and process.stdout is not None
    try:
        process.stdin.write('{"id": 1, "tool": "bash", "args": {"command": "true"}}\n')
        process.stdin.flush()
        assert json.loads(process.stdout.readline())["id"] == 1
        others = [int(t) for t in os.listdir(f"/proc/{process.pid}/task") if int(t) != process.pid]
        assert others, "serve has threads besides its main one (the live table's at least)"
        assert libc.syscall(_SYS_TGKILL, process.pid, others[-1], signal.SIGINT) == 0
        process.wait(timeout=patience(20))  # stdin still open: only the signal can end it
    finally:
        _, err = process.communicate(timeout=patience(30))
    assert process.returncode == 130 and err == "toolseam: interrupted\n"


_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}[os.uname().machine]


@pytest.mark.parametrize("attempt", range(3))
def test_serve_answers_a_call_followed_at_once_by_eof(tmp_path: Path, attempt: int) -> None:
    line = json.dumps({"id": attempt, "tool": "bash", "args": {"command": "echo hi"}})
    done = run("serve", "--stdio", "--base-dir", str(tmp_path), input=line + "\n")
    answers = [json.loads(x) for x in done.stdout.splitlines()]
    assert answers[0] == {"id": attempt, "result": answers[0]["result"]}
    assert answers[0]["result"]["output"] == "hi\n"
    assert answers[-1] == {"op": "closed"} and done.returncode == 0


def test_serve_close_cancels_with_an_answer_for_every_call(tmp_path: Path) -> None:
    lines = [json.dumps({"id": n, "tool": "bash", "args": {"command": "sleep 30"}}) for n in (1, 2)]
    started = time.monotonic()
    done = run("serve", "--stdio", "--base-dir", str(tmp_path),
               input="\n".join([*lines, '{"op": "close"}']) + "\n")
    answers = [json.loads(x) for x in done.stdout.splitlines()]
    assert sorted(a["id"] for a in answers if "id" in a) == [1, 2]
    assert all(a["error"]["code"] == "CANCELLED" for a in answers if "id" in a)
    assert answers[-1] == {"op": "closed"} and time.monotonic() - started < 20
