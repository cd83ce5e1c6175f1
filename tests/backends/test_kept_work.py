"""Kept work stays kept (issue 18, point 4): after a failed copy-back at close the container and
its workspace volume are kept, marked; the next session's janitor leaves them although their
owner process has exited (with the CLI, one process per call, that is the very next call);
``toolseam recover`` — the command the close error names — copies the work out and removes it;
the retention removes what nobody recovered."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from toolseam import Toolkit
from toolseam.backends.containers.janitor import janitor
from toolseam.backends.containers.labels import (
    KEPT_CONTAINER_LABEL,
    KEPT_LABEL,
    KEPT_RETENTION_S,
    SESSION_LABEL,
)
from toolseam.frontends.cli import main

from ..support.engines import backend, endpoint

REPO = Path(__file__).resolve().parents[2]
KeptSession = Callable[[str], tuple[dict[str, Any], list[str]]]

# A session in its own process, as the CLI makes one per call: the sandbox writes more than
# the copy limit lets home, so close keeps the container and says how to recover it.
_SESSION = r"""
import asyncio, json, sys
sys.path.insert(0, sys.argv[1])
from tests.support.engines import backend
from toolseam import CouldNotRunError, Toolkit

async def session():
    tk = Toolkit(backend(sys.argv[2], sys.argv[3], workspace_mode="copy", copy_limit=4096))
    await tk.open()
    await tk.call("bash", {"command": "echo kept > note.txt; head -c 6000 /dev/zero > big; "
                                      "mkdir sub; echo deep > sub/file; ln -s /etc etc-link"})
    try:
        await tk.close()
    except CouldNotRunError as exc:
        engine = tk.backend.sandbox.engine
        print(json.dumps({"error": exc.reason, "client": engine.connected}))

asyncio.run(session())
"""


@pytest.fixture
def kept_session(workspace: Path) -> Iterator[KeptSession]:
    """Runs a session that fails its copy-back; returns what it printed and the recover
    command its error named. Whatever a test leaves kept is removed after it."""
    commands: list[list[str]] = []

    def run(engine: str) -> tuple[dict[str, Any], list[str]]:
        done = subprocess.run([sys.executable, "-c", _SESSION, str(REPO), engine,
                               str(workspace)], capture_output=True, text=True, check=True)
        outcome = json.loads(done.stdout)
        message = outcome["error"]
        assert "Recover the work with: " in message, message
        command = shlex.split(message.split("Recover the work with: ", 1)[1].split(" --to DIR")[0])
        commands.append(command)
        return outcome, command

    yield run
    for command in commands:
        if command[-1] in _cli(*command[1:-1], "--list")[1]:
            _cli(*command[1:], "--remove")


def _cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, out.getvalue()


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_kept_work_survives_the_next_session_and_is_recovered(
        engine: str, workspace: Path, tmp_path: Path, kept_session: KeptSession) -> None:
    outcome, command = kept_session(engine)
    message = outcome["error"]
    assert "copy limit" in message and "kept for 7 days" in message, message
    assert outcome["client"] is False  # the engine client was closed all the same
    assert not (workspace / "note.txt").exists()
    assert command[:2] == ["toolseam", "recover"]

    # the next session on this engine runs the janitor; the kept owner process has exited
    async with Toolkit(backend(engine, str(workspace))) as tk:
        assert not (await tk.call("bash", {"command": "true"})).is_error
    code, listing = _cli(*command[1:-1], "--list")
    assert code == 0 and command[-1] in listing and str(workspace) in listing, listing

    dest = tmp_path / "recovered"
    code, said = _cli(*command[1:], "--to", str(dest))
    assert code == 0, said
    assert (dest / "note.txt").read_text() == "kept\n"
    assert (dest / "sub" / "file").read_text() == "deep\n"
    assert (dest / "big").stat().st_size == 6000
    assert not (dest / "etc-link").exists() and "etc-link" in said  # outside: refused, said

    code, said = _cli(*command[1:], "--remove")
    assert code == 0, said
    code, listing = _cli(*command[1:-1], "--list")
    assert command[-1] not in listing
    assert _container_exists(engine, command[-1]) is False


@pytest.mark.parametrize("engine", ["docker"])
async def test_kept_work_goes_after_its_retention(engine: str, workspace: Path,
                                                  kept_session: KeptSession) -> None:
    _, command = kept_session(engine)
    tk = Toolkit(backend(engine, str(workspace)))
    sandbox_engine = tk.backend.sandbox.engine  # type: ignore[attr-defined]
    try:
        assert command[-1] not in [c[:12] for c in janitor(sandbox_engine)]
        assert _container_exists(engine, command[-1])
        # a week later for this session's work only: tests running beside this one keep theirs
        removed = janitor(_OnlySession(sandbox_engine, command[-1]),  # type: ignore[arg-type]
                          now=time.time() + KEPT_RETENTION_S + 60)
        assert command[-1] in [c[:12] for c in removed]
        assert command[-1] not in _cli(*command[1:-1], "--list")[1]
    finally:
        sandbox_engine.close()


def _container_exists(engine: str, container: str) -> bool:
    tool = "docker" if engine == "docker" else "podman"
    args = [tool, "container", "inspect", container]
    if tool == "podman":
        args[1:1] = ["--url", endpoint("podman")]
    return subprocess.run(args, capture_output=True).returncode == 0


def test_recover_needs_a_container_or_list() -> None:
    with pytest.raises(SystemExit):
        main(["recover"])
    assert main(["recover", "--backend", "docker", "--list", "abc"]) == 2
    assert main(["recover", "--backend", "docker", "abc"]) == 2


def test_close_message_names_the_engine() -> None:
    from toolseam.backends.containers.janitor import recover_command

    assert recover_command("podman-rootless", "unix:///run/user/1001/podman/podman.sock",
                           "0123456789abcdef") == (
        "toolseam recover --backend podman --rootless --endpoint "
        "unix:///run/user/1001/podman/podman.sock 0123456789ab")


class _OnlySession:
    """The real engine, as a janitor sees it, narrowed to one kept session's containers and
    volumes (found by its kept container's id)."""

    def __init__(self, engine: Any, container: str) -> None:
        self.engine = engine
        self.session = next(labels.get(SESSION_LABEL) for _, labels in
                            engine.labeled_volumes(KEPT_LABEL)
                            if labels.get(KEPT_CONTAINER_LABEL, "").startswith(container))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def labeled_volumes(self, label: str) -> list[tuple[str, dict[str, str]]]:
        return [(volume, labels) for volume, labels in self.engine.labeled_volumes(label)
                if labels.get(SESSION_LABEL) == self.session]

    def labeled(self, label: str) -> list[tuple[str, dict[str, str]]]:
        return [(container, labels) for container, labels in self.engine.labeled(label)
                if labels.get(SESSION_LABEL) == self.session]
