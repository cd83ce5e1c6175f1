"""Interactive processes (``tools.sandbox.pty_*``, issue 35 part 4) on every backend: a Python
REPL over several calls, a password prompt, a full-screen program, Ctrl-C, 64 running and the
65th refused, an output flood, the session's end, detach/attach, and what a process on a
terminal can reach compared with a bash command.

The image has no ``top`` nor ``vi`` (images/Containerfile: Debian minbase and python3), so the
full-screen program is a curses one in python3's standard library: it moves the cursor, draws
at the terminal's last row and column, and reads single keys.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolseam import Toolkit
from toolseam.seam.lifetime import Durable
from toolseam.session.interactive import (
    InteractiveLimitError,
    InteractiveUnsupportedError,
    ProcessExitedError,
    UnknownProcessError,
)
from toolseam.session.raw import RawSandbox

from ..support.engines import LOCAL_BACKENDS as LOCAL
from ..support.engines import REMOTE_ENGINES as REMOTE
from ..support.engines import backend as engine_backend
from ..support.engines import endpoint
from ..support.processes import host_survivors


def _toolkit(engine: str, workspace: Path, **settings: object) -> Toolkit:
    if engine == "host":
        return Toolkit("host", base_dir=str(workspace), settings=settings or None)
    endpoint(engine)
    orphan_s = float(settings.get("orphan_timeout_s") or 0)  # type: ignore[arg-type]
    lifetime = {"lifetime": Durable(orphan_timeout_s=orphan_s)} if orphan_s else {}
    return Toolkit(engine_backend(engine, str(workspace), **lifetime), settings=settings or None)


@pytest.fixture(params=LOCAL + REMOTE)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=LOCAL)
def local_engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def session(engine: str, workspace: Path) -> AsyncIterator[RawSandbox]:
    async with _toolkit(engine, workspace) as tools:
        yield tools.sandbox


async def read_until(sandbox: RawSandbox, pty: int, pattern: bytes, timeout_s: float = 20,
                     max_bytes: int = 1 << 20) -> bytes:
    """Output until ``pattern`` is in it (or the process ends, or the time is up). A read takes
    what the terminal had, so output stops anywhere: wait for exactly what is asserted next."""
    seen = b""
    deadline = time.monotonic() + timeout_s
    while pattern not in seen and time.monotonic() < deadline:
        got = await sandbox.pty_read(pty, yield_ms=500, max_bytes=max_bytes)
        seen += got.data
        if got.exited:
            break
    assert pattern in seen, f"{pattern!r} not seen in {seen[-2000:]!r}"
    return seen


async def read_to_exit(sandbox: RawSandbox, pty: int, timeout_s: float = 20
                       ) -> tuple[bytes, int | None]:
    seen = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = await sandbox.pty_read(pty, yield_ms=1000)
        seen += got.data
        if got.exited:
            return seen, got.exit_code
    raise AssertionError(f"no exit in {timeout_s} s: {seen[-500:]!r}")


async def test_a_python_repl_over_several_calls(session: RawSandbox) -> None:
    await _a_python_repl_over_several_calls(session)


async def test_a_python_repl_read_one_byte_at_a_time(workspace: Path) -> None:
    """Issue 45: the REPL test read until ``answer 42`` and then asserted ``answer 42\\r\\n``,
    which a read that ended between the two broke (a CI run on the host). One-byte reads end
    between every two bytes, so a test that asserts more than it waited for fails here."""
    async with _toolkit("host", workspace) as tools:
        await _a_python_repl_over_several_calls(tools.sandbox, max_bytes=1)


async def _a_python_repl_over_several_calls(session: RawSandbox, max_bytes: int = 1 << 20
                                            ) -> None:
    repl = await session.pty_start(["python3", "-q"])
    await read_until(session, repl, b">>> ", max_bytes=max_bytes)
    await session.pty_write(repl, "x = 6 * 7\n")
    await read_until(session, repl, b">>> ", max_bytes=max_bytes)
    await session.pty_write(repl, "print('answer', x)\n")
    await read_until(session, repl, b"\r\nanswer 42\r\n", max_bytes=max_bytes)
    await session.pty_write(repl, "import os, sys; print(os.isatty(0), sys.stdin.isatty())\n")
    await read_until(session, repl, b"True True", max_bytes=max_bytes)
    await session.pty_write(repl, "raise SystemExit(7)\n")
    _, code = await read_to_exit(session, repl)
    assert code == 7
    with pytest.raises(UnknownProcessError):  # the read that saw the exit forgot it
        await session.pty_read(repl, yield_ms=0)


async def test_a_password_prompt_does_not_echo(session: RawSandbox) -> None:
    """``read -s`` as sudo asks: the prompt comes, the typed secret is not echoed, the
    program gets it."""
    prompt = await session.pty_start(["bash", "-c", "read -s -p 'Password: ' pw; echo; "
                                      "echo \"len=${#pw}\""])
    await read_until(session, prompt, b"Password: ")
    await session.pty_write(prompt, "hunter22\n")
    seen, code = await read_to_exit(session, prompt)
    assert b"len=8" in seen and b"hunter22" not in seen and code == 0


_CURSES = """
import curses
def main(screen):
    rows, cols = screen.getmaxyx()
    screen.addstr(0, 0, "FULL %dx%d" % (rows, cols))
    screen.addstr(rows - 1, 0, "BOTTOM-ROW")
    screen.refresh()
    while screen.getkey() != "q":
        screen.addstr(1, 0, "key seen")
        screen.refresh()
curses.wrapper(main)
print("left cleanly")
"""


async def test_a_full_screen_program_and_a_resize(session: RawSandbox) -> None:
    screen = await session.pty_start(["python3", "-c", _CURSES], rows=30, cols=100)
    seen = await read_until(session, screen, b"BOTTOM-ROW")
    assert b"FULL 30x100" in seen
    assert b"\x1b[?1049h" in seen  # the alternate screen: a full-screen program
    assert re.search(rb"\x1b\[30(;1H|d)", seen)  # the cursor put on the 30th row
    await session.pty_write(screen, "x")
    await read_until(session, screen, b"key seen")
    await session.pty_write(screen, "q")
    seen, code = await read_to_exit(session, screen)
    assert b"left cleanly" in seen and code == 0
    sized = await session.pty_start(["sh", "-c", "stty size; read _; stty size"], rows=24,
                                    cols=80)
    await read_until(session, sized, b"24 80")
    await session.pty_resize(sized, 40, 132)
    await session.pty_write(sized, "\n")
    assert b"40 132" in (await read_to_exit(session, sized))[0]


async def test_the_terminal_is_its_owners_alone(session: RawSandbox) -> None:
    """No other user (on the host backend: this machine's) can write to it: mode 0600, not
    devpts' 0620 for the tty group."""
    probe = await session.pty_start(["sh", "-c", "stat -c 'mode=%a' \"$(tty)\""])
    seen, code = await read_to_exit(session, probe)
    assert b"mode=600" in seen and code == 0


async def test_ctrl_c_interrupts_the_running_command(session: RawSandbox) -> None:
    shell = await session.pty_start(["sh", "-i"], env={"PS1": "ready$ "})
    await read_until(session, shell, b"ready$ ")
    await session.pty_write(shell, "sleep 300; echo not-interrupted\n")
    await asyncio.sleep(0.5)
    started = time.monotonic()
    await session.pty_write(shell, "\x03")
    seen = await read_until(session, shell, b"ready$ ")
    assert time.monotonic() - started < 5 and b"\nnot-interrupted" not in seen
    await session.pty_write(shell, "echo still-here\n")
    await read_until(session, shell, b"still-here")
    assert await session.pty_terminate(shell) is not None


async def test_64_running_and_the_65th_refused(session: RawSandbox) -> None:
    ids = [await session.pty_start(["sleep", "300"]) for _ in range(64)]
    assert len(set(ids)) == 64
    with pytest.raises(InteractiveLimitError, match="64 interactive processes are running"):
        await session.pty_start(["sleep", "300"])
    assert len(await session.pty_list()) == 64
    await session.pty_terminate(ids[0])  # one ended: room for another
    ids.append(await session.pty_start(["echo", "room"]))
    assert b"room" in (await read_to_exit(session, ids[-1]))[0]


async def test_an_output_flood_keeps_the_newest_mib(session: RawSandbox) -> None:
    flood = await session.pty_start(["python3", "-c", "import sys\nfor i in range(400000): "
                                     "sys.stdout.write('line %07d\\n' % i)\nprint('END')"],
                                     tty=False)
    await asyncio.sleep(2)  # 5.2 MB written while nobody reads
    first = await session.pty_read(flood, yield_ms=1000, max_bytes=16 << 20)
    assert first.truncated_bytes > 0
    assert len(first.data) <= 1 << 20
    whole, dropped, got = first.data, first.truncated_bytes, first
    deadline = time.monotonic() + 60
    while not got.exited and time.monotonic() < deadline:
        got = await session.pty_read(flood, yield_ms=1000)
        whole, dropped = whole + got.data, dropped + got.truncated_bytes
    assert whole.endswith(b"END\n") and got.exit_code == 0
    assert b"line 0399999\n" in whole and b"line 0000000" not in whole
    assert dropped + len(whole) == 13 * 400_000 + 4  # every byte kept or counted as dropped


def _sleeper(marker: str) -> str:
    """A long sleep whose command line, seen from this machine, holds ``marker``."""
    return f"python3 -c 'import time; time.sleep(300)' {marker}"


async def test_terminate_ends_the_whole_tree(local_engine: str, workspace: Path) -> None:
    marker = f"pty-tree-{time.monotonic_ns()}"
    async with _toolkit(local_engine, workspace) as tools:
        sandbox = tools.sandbox
        tree = await sandbox.pty_start(["sh", "-c", f"{_sleeper(marker)} & setsid "
                                        f"{_sleeper(marker)} & exec {_sleeper(marker)}"])
        await asyncio.sleep(0.5)
        assert len(host_survivors(marker)) >= 3
        await sandbox.pty_terminate(tree)
        assert host_survivors(marker) == []
        with pytest.raises(UnknownProcessError):
            await sandbox.pty_write(tree, "x")


async def test_every_process_ends_with_the_session(local_engine: str, workspace: Path) -> None:
    marker = f"pty-end-{time.monotonic_ns()}"
    async with _toolkit(local_engine, workspace) as tools:
        for _ in range(3):
            await tools.sandbox.pty_start(["sh", "-c", f"{_sleeper(marker)} & {_sleeper(marker)}"])
        await asyncio.sleep(0.5)
        assert len(host_survivors(marker)) >= 6
    deadline = time.monotonic() + 10
    while host_survivors(marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert host_survivors(marker) == []


async def test_a_process_outlives_detach_and_is_reached_after_attach(
        engine: str, workspace: Path) -> None:
    tools = _toolkit(engine, workspace, orphan_timeout_s=60)
    await tools.open()
    repl = await tools.sandbox.pty_start(["python3", "-q"])
    await read_until(tools.sandbox, repl, b">>> ")
    await tools.sandbox.pty_write(repl, "kept = 'across-attach'\n")
    await read_until(tools.sandbox, repl, b">>> ")
    handle = await tools.detach()
    options: dict[str, object] = {}
    if engine == "docker-remote":
        from toolseam.backends.containers.engine.attach import TlsFiles

        from ..support.engines import required_env
        options["backend_options"] = {"tls": TlsFiles.from_dir(
            required_env("TOOLSEAM_REMOTE_DOCKER_CERT_PATH", engine))}
    again = await Toolkit.attach(handle, **options)
    try:
        assert [p.id for p in await again.sandbox.pty_list()] == [repl]
        await again.sandbox.pty_write(repl, "print(kept.upper())\n")
        await read_until(again.sandbox, repl, b"ACROSS-ATTACH")
    finally:
        await again.close()


_PROBE = ("grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t ' ' '; "
          "cat /proc/1/environ >/dev/null 2>&1 && echo pid1-environ-read || echo pid1-environ-no; "
          "ls /proc/1/fd >/dev/null 2>&1 && echo pid1-fds-listed || echo pid1-fds-no; "
          "kill -0 1 2>/dev/null && echo pid1-signal-ok || echo pid1-signal-no; "
          "f=$(mktemp); chmod 4755 \"$f\" 2>/dev/null && echo setuid-made || echo setuid-no; "
          "rm -f \"$f\"; "
          "ls /proc/self/fd | tr '\\n' ' '; echo; "
          "for t in /run/toolseam/* /tmp/toolseam-session-*/*; do "
          "[ -S \"$t\" ] && { [ -w \"$t\" ] && echo socket-writable || echo socket-seen; }; "
          "done; echo probe-done")


async def test_a_terminal_gets_nothing_a_bash_command_does_not(engine: str,
                                                                session: RawSandbox) -> None:
    """The attacker's view: the same probe of the agent (pid 1: in a container, and on the
    host in the agent's own pid namespace), its control socket, the guards and the open
    descriptors, run as a raw command and on a terminal, says the same."""
    plain = await session.exec(["sh", "-c", _PROBE])
    proc = await session.pty_start(["sh", "-c", _PROBE], tty=False)
    seen, code = await read_to_exit(session, proc)
    assert code == 0 and plain.exit_code == 0
    assert seen.decode().splitlines() == plain.stdout.splitlines()
    on_tty = await session.pty_start(["sh", "-c", _PROBE])
    seen, _ = await read_to_exit(session, on_tty)
    assert seen.decode().replace("\r\n", "\n").splitlines() == plain.stdout.splitlines()
    if not tools_are_local(session):  # in a container, the agent is out of the command's reach
        for line in ("NoNewPrivs: 1", "Seccomp: 2", "pid1-environ-no", "pid1-signal-no"):
            assert line in plain.stdout.splitlines()
        if engine in LOCAL:  # bind mode: the set-id guard is required (copy mode: a copy)
            assert "setuid-no" in plain.stdout.splitlines()


def tools_are_local(sandbox: RawSandbox) -> bool:
    info = sandbox._tk.info
    return info is not None and info.local


async def test_clear_errors(tmp_path: Path) -> None:
    async with Toolkit("host", base_dir=str(tmp_path)) as tools:
        sandbox = tools.sandbox
        with pytest.raises(UnknownProcessError):
            await sandbox.pty_read(999, yield_ms=0)
        with pytest.raises(ValueError, match="argv"):
            await sandbox.pty_start("python3 -q")
        with pytest.raises(ValueError, match="rows and cols"):
            await sandbox.pty_start(["sh"], rows=0)
        with pytest.raises(FileNotFoundError):
            await sandbox.pty_start(["sh"], cwd="no/such/dir")
        quick = await sandbox.pty_start(["true"])
        await asyncio.sleep(0.5)
        with pytest.raises((ProcessExitedError, UnknownProcessError)):
            await sandbox.pty_write(quick, "too late\n")
    from toolseam.testing.fake import FakeBackend
    async with Toolkit(FakeBackend(), tools={"bash": False}) as fake:
        assert not fake.sandbox.supports_pty
        with pytest.raises(InteractiveUnsupportedError, match="cannot run interactive"):
            await fake.sandbox.pty_start(["sh"])


async def test_a_command_ending_leaves_a_later_terminal_alone(tmp_path: Path) -> None:
    """A job's leftovers are the processes orphaned out of it and started after it: a
    terminal started while the job ran is the agent's child too, but never the job's."""
    async with Toolkit("host", base_dir=str(tmp_path)) as tools:
        job = asyncio.ensure_future(tools.sandbox.exec(["sleep", "1"]))
        await asyncio.sleep(0.3)
        repl = await tools.sandbox.pty_start(["python3", "-q"])
        assert (await job).exit_code == 0
        await tools.sandbox.pty_write(repl, "print('alive', 1 + 1)\n")
        await read_until(tools.sandbox, repl, b"alive 2")


async def test_the_terminal_size_wins_over_lines_and_columns(tmp_path: Path) -> None:
    """A LINES/COLUMNS in the environment commands start from (a host shell's) would win over
    the terminal's size in curses, and stay wrong after a resize: a terminal never inherits
    them (the caller's own ``env`` may still set them)."""
    import os
    env = {**os.environ, "LINES": "24", "COLUMNS": "80"}
    async with Toolkit("host", base_dir=str(tmp_path), env=env) as tools:
        screen = await tools.sandbox.pty_start(["python3", "-c", _CURSES], rows=30, cols=100)
        assert b"FULL 30x100" in await read_until(tools.sandbox, screen, b"BOTTOM-ROW")
        forced = await tools.sandbox.pty_start(["python3", "-c", _CURSES], rows=30, cols=100,
                                               env={"LINES": "20", "COLUMNS": "70"})
        assert b"FULL 20x70" in await read_until(tools.sandbox, forced, b"BOTTOM-ROW")


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(st.binary(min_size=0, max_size=3000), min_size=1, max_size=6))
async def test_bytes_written_come_back_exactly_on_pipes(tmp_path: Path,
                                                        chunks: list[bytes]) -> None:
    """Whatever bytes are written (NULs, invalid UTF-8, several writes) a ``cat`` on pipes
    gives back byte for byte, in order; on a terminal the line discipline would edit them."""
    async with Toolkit("host", base_dir=str(tmp_path), tools={"bash": False}) as tools:
        cat = await tools.sandbox.pty_start(["cat"], tty=False)
        for chunk in chunks:
            await tools.sandbox.pty_write(cat, chunk)
        want = b"".join(chunks)
        seen = b""
        deadline = time.monotonic() + 10
        while len(seen) < len(want) and time.monotonic() < deadline:
            seen += (await tools.sandbox.pty_read(cat, yield_ms=500)).data
        assert seen == want


@pytest.mark.parametrize("engine", ["host", "docker"])
async def test_an_orphaned_session_ends_its_processes(engine: str, workspace: Path) -> None:
    """Detached and never attached again: at ``orphan_timeout_s`` the sandbox ends, and every
    process on a terminal with it."""
    marker = f"pty-orphan-{time.monotonic_ns()}"
    tools = _toolkit(engine, workspace, orphan_timeout_s=1)
    await tools.open()
    await tools.sandbox.pty_start(["sh", "-c", f"{_sleeper(marker)} & {_sleeper(marker)}"])
    await asyncio.sleep(0.5)
    assert len(host_survivors(marker)) >= 2
    await tools.detach()
    deadline = time.monotonic() + 20
    while host_survivors(marker) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert host_survivors(marker) == []
