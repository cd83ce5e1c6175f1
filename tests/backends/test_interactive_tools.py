"""The optional model tools ``exec_command`` and ``write_stdin`` (codex's shape) over
interactive processes: off by default, a REPL driven by a model's calls, the output budget,
Ctrl-C, and clear errors — on the host and in a container."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolseam import Toolkit

from ..support.engines import backend as engine_backend
from ..support.engines import endpoint


def _toolkit(engine: str, workspace: Path, **options: object) -> Toolkit:
    if engine == "host":
        return Toolkit("host", base_dir=str(workspace), interactive_tools=True, **options)  # type: ignore[arg-type]
    endpoint(engine)
    return Toolkit(engine_backend(engine, str(workspace)), interactive_tools=True, **options)  # type: ignore[arg-type]


async def test_off_by_default(tmp_path: Path) -> None:
    async with Toolkit("host", base_dir=str(tmp_path)) as tools:
        assert "exec_command" not in tools.tool_names
    async with Toolkit("host", base_dir=str(tmp_path), interactive_tools=True) as tools:
        assert tools.tool_names[-2:] == ["exec_command", "write_stdin"]
        names = [d["name"] for d in tools.declarations("anthropic")]
        assert names[-2:] == ["exec_command", "write_stdin"]


@pytest.mark.parametrize("engine", ["host", "docker"])
async def test_a_repl_driven_by_tool_calls(engine: str, workspace: Path) -> None:
    async with _toolkit(engine, workspace) as tools:
        started = await tools.call("exec_command", {"cmd": "python3 -q", "yield_time_ms": 3000})
        session = started.metadata["session_id"]
        assert isinstance(session, int) and ">>> " in started.output
        assert f"running with session ID {session}" in started.model_text()
        answer = await tools.call("write_stdin", {"session_id": session,
                                                  "chars": "print(6 * 7)\n",
                                                  "yield_time_ms": 2000})
        assert "\n42\n" in answer.output and answer.metadata["exit_code"] is None
        await tools.call("write_stdin", {"session_id": session,
                                         "chars": "import time; time.sleep(60)\n"})
        interrupted = await tools.call("write_stdin", {"session_id": session, "chars": "\u0003",
                                                       "yield_time_ms": 2000})
        assert "KeyboardInterrupt" in interrupted.output
        ended = await tools.call("write_stdin", {"session_id": session,
                                                 "chars": "raise SystemExit(3)\n",
                                                 "yield_time_ms": 5000})
        assert ended.metadata == {**ended.metadata, "session_id": None, "exit_code": 3}
        assert "process exited with code 3" in ended.model_text()
        gone = await tools.call("write_stdin", {"session_id": session, "chars": "x"})
        assert gone.is_error and "no interactive process" in gone.output


async def test_output_is_held_to_max_output_tokens(tmp_path: Path) -> None:
    async with _toolkit("host", tmp_path) as tools:
        flood = await tools.call("exec_command", {"cmd": "seq 1 200000",
                                                  "max_output_tokens": 500})
        text = flood.model_text()
        assert len(text) <= 500 * 4 + 200  # the budget, and the note after it
        assert "omitted" in text and "200000" in text  # the tail kept, the cut marked
        assert "process exited with code 0" in text
        assert flood.output.endswith("200000\n")  # output itself stays whole for the host


async def test_bad_arguments_are_results_the_model_reads(tmp_path: Path) -> None:
    async with _toolkit("host", tmp_path, confine_to_base_dir=True) as tools:
        bad = await tools.call("exec_command", {"cmd": "", "bogus": 1})
        assert bad.is_error and "cmd" in bad.output and "bogus" in bad.output
        outside = await tools.call("exec_command", {"cmd": "pwd", "workdir": "/etc"})
        assert outside.is_error and "outside the base directory" in outside.output
        missing = await tools.call("exec_command", {"cmd": "pwd", "workdir": "no/such"})
        assert missing.is_error and "no/such" in missing.output


async def test_a_session_id_is_good_after_detach_and_attach(tmp_path: Path) -> None:
    tools = _toolkit("host", tmp_path, settings={"orphan_timeout_s": 30})
    started = await tools.call("exec_command", {"cmd": "python3 -q", "yield_time_ms": 1500})
    handle = await tools.detach()
    again = await Toolkit.attach(handle, interactive_tools=True)
    try:
        answer = await again.call("write_stdin", {"session_id": started.metadata["session_id"],
                                                  "chars": "print('back', 7 * 6)\n",
                                                  "yield_time_ms": 1500})
        assert "back 42" in answer.output
    finally:
        await again.close()
