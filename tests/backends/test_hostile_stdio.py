"""``serve --stdio`` against a buggy or hostile client (issue 19): every line read gets exactly
one answer, limits are checked before parsing, the server serves on, and every line it writes
is strict JSON in valid UTF-8. On the host and on docker."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolseam.stdio_wire import deeper_than

from ..support.engines import IMAGE, endpoint, remove_shared, shared_dir
from ..support.stdio import RawServer

TOOLSEAM = [sys.executable, "-m", "toolseam.frontends.cli"]


def _config(tmp_path: Path, **limits: int) -> list[str]:
    config = tmp_path / "settings.json"
    config.write_text(json.dumps({"input_limits": limits} if limits else {}))
    return ["--config", str(config)]


def _call_works(server: RawServer, request_id: Any = "after") -> None:
    server.send({"id": request_id, "tool": "bash", "args": {"command": "echo still here"}})
    answer = server.answer()
    assert answer["id"] == request_id and answer["result"]["output"] == "still here\n", answer


def _bad(answer: dict[str, Any], *words: str) -> None:
    assert answer["error"]["code"] == "BAD_REQUEST", answer
    for word in words:
        assert word in answer["error"]["message"], answer


def hostile_session(server: RawServer) -> None:
    """Each hostile line, then a call that must still work."""
    server.send_raw(b"[" * 100_000 + b"\n")  # RecursionError killed the server
    _bad(server.answer(), "deeper than 512", "input_limits.json_depth")
    server.send_raw(b'{"id": 1, "tool": "bash", "args": ' + b'{"a": ' * 600 + b"1" + b"}" * 601
                    + b"\n")
    _bad(server.answer(), "input_limits.json_depth")
    _call_works(server)
    server.send_raw(b'{"id": NaN, "tool": "bash", "args": {"command": "true"}}\n')
    _bad(server.answer(), "NaN")  # came back as bare NaN: not JSON
    server.send_raw(b'{"id": 7, "tool": "bash", "args": {"timeout": Infinity, "command": "x"}}\n')
    _bad(server.answer(), "Infinity")
    for wrong in (1.5, None, True, [1], {"a": 1}, "x" * 2000, 2**70):
        server.send({"id": wrong, "tool": "bash", "args": {"command": "true"}})
        answer = server.answer()
        _bad(answer, "id")
        assert answer["id"] is None
    # a lone surrogate in an id is echoed escaped: valid UTF-8, the same id once parsed
    server.send_raw(b'{"id": "a\\ud800b", "tool": "bash", "args": {"command": "echo s"}}\n')
    answer = server.answer()
    assert answer["id"] == "a\ud800b" and answer["result"]["output"] == "s\n"
    server.send_raw(b'{"id": "bad \xff utf8", "tool": "bash"}\n')
    _bad(server.answer(), "not JSON")
    # an id in flight cannot be reused; afterwards it can
    server.send({"id": "busy", "tool": "bash", "args": {"command": "sleep 0.5; echo first"}})
    server.send({"id": "busy", "tool": "bash", "args": {"command": "echo second"}})
    duplicate = server.answer()
    assert duplicate["id"] == "busy" and duplicate["error"]["code"] == "DUPLICATE_ID"
    first = server.answer()
    assert first["id"] == "busy" and first["result"]["output"] == "first\n"
    server.send({"id": "busy", "tool": "bash", "args": {"command": "echo again"}})
    assert server.answer()["result"]["output"] == "again\n"
    server.send({"id": 1, "tool": "bash", "args": {"command": "echo int"}})
    server.send({"id": "1", "tool": "bash", "args": {"command": "echo str"}})  # not the same id
    answers = {json.dumps(a["id"]): a["result"]["output"] for a in (server.answer(), server.answer())}
    assert answers == {"1": "int\n", '"1"': "str\n"}
    server.send({"op": "user_message", "text": "hello \ud800"})
    assert server.answer() == {"op": "noted"}
    _call_works(server, 99)


def test_hostile_lines_each_get_one_answer_and_the_server_serves_on(tmp_path: Path) -> None:
    with RawServer("--base-dir", str(tmp_path)) as server:
        hostile_session(server)
        assert server.close() == 0


@pytest.mark.engines  # needs an engine without naming it in a parameter
def test_hostile_lines_on_a_container_backend() -> None:
    url = endpoint("docker")
    workspace = shared_dir()
    try:
        with RawServer("--backend", "docker", "--endpoint", url, "--image", IMAGE,
                       "--workspace", str(workspace)) as server:
            hostile_session(server)
            assert server.close() == 0
    finally:
        remove_shared(workspace)


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_line_over_the_limit_is_skipped_unread_and_answered(tmp_path: Path) -> None:
    """A line over ``input_limits.line_bytes`` (default 64 MiB) is refused naming the limit,
    quickly, without holding it: a 1 GiB line killed the server; 200 MB took 73 s, 632 MiB."""
    with RawServer("--base-dir", str(tmp_path)) as server:
        _call_works(server, "before")
        baseline = _peak_rss(server.proc.pid)
        started = time.monotonic()
        block = b"x" * (1 << 20)
        server.send_raw(b'{"id": "huge", "tool": "write", "args": {"path": "f", "content": "')
        for _ in range(200):  # 200 MiB
            server.send_raw(block)
        server.send_raw(b'"}}\n')
        _bad(server.answer(), "over the limit of 67108864", "input_limits.line_bytes")
        assert time.monotonic() - started < 20
        assert _peak_rss(server.proc.pid) - baseline < 96 << 20  # never the line, nor its half
        _call_works(server)
        assert not (tmp_path / "f").exists()
        assert server.close() == 0


def test_line_and_depth_limits_are_settings(tmp_path: Path) -> None:
    with RawServer("--base-dir", str(tmp_path),
                   *_config(tmp_path, line_bytes=4096, json_depth=8)) as server:
        server.send({"id": 1, "tool": "write", "args": {"path": "f", "content": "y" * 5000}})
        _bad(server.answer(), "line of 50", "over the limit of 4096")
        server.send({"id": 2, "tool": "bash", "args": {"command": "true"}, "x": [[[[[[[[1]]]]]]]]})
        _bad(server.answer(), "deeper than 8")
        server.send({"id": 3, "tool": "write", "args": {"path": "f", "content": "[[[[[[[[[[[["}})
        assert server.answer()["result"]["output"] == "Wrote 12 bytes to f"  # strings don't nest
        server.send_raw(b"x" * 10_000)  # a last line without a newline still gets its answer
        assert server.proc.stdin is not None
        server.proc.stdin.close()
        _bad(server.answer(), "over the limit of 4096")
        assert server.answer() == {"op": "closed"}
        assert server.finish() == 0


# --- every line, exactly one answer -------------------------------------------------------
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=12)
ids = st.one_of(st.text(max_size=30), st.integers(), st.floats(), st.none(), st.booleans(),
                st.lists(st.integers(), max_size=2))
calls = st.fixed_dictionaries(
    {"id": ids, "tool": st.sampled_from(["glob", "read", "grep", "nope"])},
    optional={"args": st.one_of(json_values, st.fixed_dictionaries(
        {}, optional={"pattern": st.text(max_size=10), "path": st.text(max_size=10),
                      "limit": json_values}))})
ops = st.fixed_dictionaries({"op": st.sampled_from(["end_turn", "pin_shell", "user_message",
                                                    "answer", "nope", 3])},
                            optional={"text": json_values, "qid": json_values,
                                      "answer": json_values})


def _encoded(value: Any) -> bytes:
    return json.dumps(value).encode("utf-8", "surrogatepass")  # lone surrogates stay escaped


lines = st.one_of(
    calls.map(_encoded), ops.map(_encoded), json_values.map(_encoded),
    st.binary(max_size=60).filter(lambda b: b"\n" not in b and b.strip() != b""),
    st.integers(1, 2000).map(lambda n: b"[" * n + b"]" * n),
    st.text(max_size=40).filter(lambda t: "\n" not in t and "\r" not in t and t.strip() != "")
    .map(lambda t: t.encode("utf-8", "surrogatepass")),
)


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    work = tmp_path_factory.mktemp("every-line")
    (work / "a.txt").write_text("alpha\n")
    with RawServer("--base-dir", str(work)) as server:
        yield server
        assert server.close() == 0


@given(batch=st.lists(lines, min_size=1, max_size=12))
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_every_line_gets_exactly_one_answer(shared_server: RawServer, batch: list[bytes]) -> None:
    shared_server.send_raw(b"".join(line + b"\n" for line in batch))
    for _ in batch:  # none is blank (a blank line is not a request)
        answer = shared_server.answer()
        assert ("result" in answer or "error" in answer
                or answer.get("op") in {"end_turn", "pinned", "noted", "answered"}), answer
    shared_server.send({"op": "end_turn"})  # nothing more was pending: the ack comes next
    assert shared_server.answer() == {"op": "end_turn", "killed_jobs": []}


@given(value=json_values, limit=st.integers(0, 12))
@settings(max_examples=300, deadline=None)
def test_the_depth_scan_agrees_with_the_parsed_depth(value: Any, limit: int) -> None:
    def depth(v: Any) -> int:
        if isinstance(v, list):
            return 1 + max(map(depth, v), default=0)
        if isinstance(v, dict):
            return 1 + max(map(depth, v.values()), default=0)
        return 0

    line = json.dumps(value).encode("utf-8", "surrogatepass")
    assert deeper_than(line, limit) == (depth(value) > limit)


def test_the_depth_scan_is_linear_on_hostile_lines() -> None:
    size = 8 << 20
    for line in (b'"' * size, b'"' + b'\\"' * (size // 2), b"[" * size,
                 (b"[" * 500 + b"]" * 500) * (size // 1000), b"[}" * (size // 2)):
        started = time.monotonic()
        deeper_than(line, 512)
        assert time.monotonic() - started < 5, line[:20]

