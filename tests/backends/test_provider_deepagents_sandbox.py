"""``ToolseamSandbox``'s own promises beyond langchain-tests' suite: output in the order it was
written, the timeout killing the whole command, use from async code, bad arguments refused,
an edit that lost a race refused, and nothing left behind by ``delete()``."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid

import pytest

from toolseam import ConfigurationError, CouldNotRunError
from toolseam.integrations.deepagents import ToolseamSandbox

from ..support.engines import remove_shared
from ..support.processes import host_started, host_survivors
from ..support.providers import PROVIDER_BACKENDS, provider_options


def test_output_keeps_its_order_and_exit_code() -> None:
    with ToolseamSandbox("host") as sandbox:
        result = sandbox.execute("echo one; echo two >&2; echo three; exit 3")
        assert (result.output, result.exit_code, result.truncated) == ("one\ntwo\nthree\n", 3,
                                                                        False)
        flood = sandbox.execute("head -c 3000000 /dev/zero | tr '\\0' x")
        assert flood.truncated and flood.exit_code == 0


def test_a_timeout_kills_everything_the_command_started() -> None:
    marker = uuid.uuid4().hex[:10]
    with ToolseamSandbox("host") as sandbox:
        started = time.monotonic()
        result = sandbox.execute(f"sh -c 'sleep 300; : {marker}' & wait", timeout=1)
        assert result.exit_code == 124 and "timed out after 1 seconds" in result.output
        assert time.monotonic() - started < 30
        deadline = time.monotonic() + 10
        while host_survivors(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert host_survivors(marker) == []
        with pytest.raises(ValueError, match="positive"):
            sandbox.execute("true", timeout=0)


def test_delete_ends_processes_and_removes_the_workspace_it_made() -> None:
    marker = uuid.uuid4().hex[:10]
    sandbox = ToolseamSandbox("host")
    root = sandbox.working_dir
    sandbox.execute(f"sh -c 'sleep 300; : {marker}' >/dev/null 2>&1 &")
    assert host_started(marker)  # a background process outlives its command …
    assert sandbox.write(f"{root}/kept.txt", "x").error is None
    sandbox.delete()  # … not the sandbox
    sandbox.delete()  # idempotent
    deadline = time.monotonic() + 10
    while host_survivors(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert host_survivors(marker) == [] and not os.path.exists(root)


def test_delete_with_a_path_is_the_file_delete(tmp_path: object) -> None:
    with ToolseamSandbox("host") as sandbox:
        path = f"{sandbox.working_dir}/gone.txt"
        sandbox.write(path, "x")
        assert sandbox.delete(path).error is None
        assert sandbox.download_files([path])[0].error == "file_not_found"


async def test_async_use_from_a_running_loop() -> None:
    sandbox = await ToolseamSandbox.acreate("host")
    try:
        results = await asyncio.gather(*(sandbox.aexecute(f"echo {n}") for n in range(10)))
        assert [r.output for r in results] == [f"{n}\n" for n in range(10)]
        path = f"{sandbox.working_dir}/a.txt"
        assert (await sandbox.awrite(path, "alpha\nbeta\n")).error is None
        assert (await sandbox.aedit(path, "beta", "gamma")).occurrences == 1
        read = await sandbox.aread(path)
        assert read.file_data is not None and read.file_data["content"] == "alpha\ngamma"
    finally:
        await sandbox.adelete()


def test_an_edit_keeps_crlf_and_refuses_a_file_changed_under_it() -> None:
    with ToolseamSandbox("host") as sandbox:
        path = f"{sandbox.working_dir}/crlf.txt"
        sandbox.upload_files([(path, b"one\r\ntwo\r\n")])
        assert sandbox.edit(path, "one\ntwo", "1\n2").error is None
        assert sandbox.download_files([path])[0].content == b"1\r\n2\r\n"
        assert sandbox.edit(f"{sandbox.working_dir}/missing.txt", "a", "b").error == (
            f"Error: File '{sandbox.working_dir}/missing.txt' not found")


def test_bad_arguments_are_refused_with_what_was_wrong() -> None:
    with pytest.raises(ConfigurationError, match="image"):
        ToolseamSandbox("host", image="alpine")
    with pytest.raises(ConfigurationError, match="backend"):
        ToolseamSandbox("vm")
    with ToolseamSandbox("host") as sandbox:
        assert sandbox.execute("").exit_code == 1
        assert sandbox.upload_files([("rel.txt", b"x")])[0].error == "invalid_path"


def test_a_failed_open_leaves_no_thread_behind() -> None:
    with pytest.raises(CouldNotRunError, match="unreachable"):
        ToolseamSandbox("podman", image="x",
                        backend_options={"endpoint": "unix:///nonexistent.sock"})
    assert [t for t in threading.enumerate() if t.name == "toolseam-deepagents"] == []


@pytest.mark.parametrize("engine", PROVIDER_BACKENDS)
async def test_large_output_whole_on_every_backend(engine: str) -> None:
    """The suite's 500 KiB rules, six at once, none cut — with ``python3`` as well as the
    ``python`` the suite runs (the reference image links one to the other)."""
    name, options, made = provider_options(engine)
    sandbox = await ToolseamSandbox.acreate(name, **options)
    try:
        command = "{} -c \"import sys; sys.stdout.write('x' * (500 * 1024))\""
        results = await asyncio.gather(*(sandbox.aexecute(command.format(python))
                                         for python in ("python", "python3") * 3))
        assert [(r.exit_code, r.truncated, len(r.output)) for r in results] == [
            (0, False, 500 * 1024)] * 6
    finally:
        await sandbox.adelete()
        if made is not None:
            remove_shared(made)


def test_a_forgotten_sandbox_still_ends() -> None:
    import gc

    marker = uuid.uuid4().hex[:10]
    sandbox = ToolseamSandbox("host")
    root = sandbox.working_dir
    sandbox.execute(f"sh -c 'sleep 300; : {marker}' >/dev/null 2>&1 &")
    assert host_started(marker)
    del sandbox
    gc.collect()
    deadline = time.monotonic() + 10
    while host_survivors(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert host_survivors(marker) == [] and not os.path.exists(root)
