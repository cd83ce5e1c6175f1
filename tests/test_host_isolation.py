"""What a command on the host backend can see of the host: no secrets, no fds, no ancestors."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from toolseam import Toolkit

SECRET = "s3cr3t-value-that-must-not-leak"


@pytest_asyncio.fixture
async def tk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Toolkit]:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("GITHUB_TOKEN", SECRET)
    monkeypatch.setenv("MY_SECRET_THING", SECRET)
    monkeypatch.setenv("HARMLESS_SETTING", "visible")
    async with Toolkit("host", base_dir=str(tmp_path)) as toolkit:
        yield toolkit


async def test_secrets_are_not_in_the_command_environment(tk: Toolkit) -> None:
    result = await tk.call("bash", {"command": "env"})
    assert SECRET not in result.output
    assert "HARMLESS_SETTING=visible" in result.output


async def test_no_ancestor_environ_leaks_the_secret(tk: Toolkit) -> None:
    # Walk every ancestor the command can see and dump its environ.
    script = ("pid=$$; while [ \"$pid\" -gt 1 ] 2>/dev/null; do "
              "cat /proc/$pid/environ 2>/dev/null | tr '\\0' '\\n'; "
              "pid=$(awk '/^PPid:/ {print $2}' /proc/$pid/status); done; "
              "cat /proc/1/environ | tr '\\0' '\\n'; echo; echo walked")
    result = await tk.call("bash", {"command": script})
    assert result.output.rstrip().endswith("walked")
    assert SECRET not in result.output
    # and the host process itself is invisible from inside the namespace
    assert tk.info is not None and tk.info.pid_namespace
    search = await tk.call("bash", {"command": f"grep -l {SECRET} /proc/*/environ 2>/dev/null; true"})
    assert search.output == ""
    assert os.getpid() > 1


async def test_allow_listed_variable_passes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from toolseam import Settings

    monkeypatch.setenv("DEPLOY_TOKEN", "allowed-value")
    async with Toolkit("host", base_dir=str(tmp_path),
                       settings=Settings(env_allow=["DEPLOY_TOKEN"])) as tk:
        assert (await tk.call("bash", {"command": "echo $DEPLOY_TOKEN"})).output == "allowed-value\n"


async def test_stdin_is_dev_null_and_no_extra_fds(tk: Toolkit) -> None:
    result = await tk.call("bash", {"command": "cat; readlink /proc/self/fd/0; ls /proc/self/fd"})
    lines = result.output.split()
    assert lines[0] == "/dev/null"
    # 0, 1, 2 and the fd `ls` itself opens to read the directory
    assert sorted(int(fd) for fd in lines[1:]) == [0, 1, 2, 3]
