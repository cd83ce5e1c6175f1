"""Starting the sandbox agent, whatever the sandbox, and getting a channel to it.

* ``agent_command`` — the ``python -c`` arguments that run the agent package from a directory
  (the host runs it from this package; a container from a read-only mount of a staged copy).
* ``stage_agent`` — that world-readable copy, for container engines to mount.
* ``LocalAgent`` — the host's agent: a child process on a socketpair, in a private pid
  namespace when the system allows one; ``start`` hands back its ``AgentChannel``.

A container's agent is started by its engine (``_container_sandbox.py``: the container's first
program is ``agent_command``) and reached with ``AgentChannel.connect`` on a socket in a
bind-mounted directory. Either way the session ends with ``AgentChannel.shutdown``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import socket
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

from ..seam.errors import CouldNotRunError
from ._channel import AgentChannel
from .agent import wire

AGENT_PARENT = str(Path(__file__).resolve().parent)  # holds the agent/ package
_START_TIMEOUT_S = 10.0


def agent_command(parent: str) -> list[str]:
    """``python -c`` arguments that run the agent package found in ``parent``."""
    code = (f"import sys; sys.path.insert(0, {parent!r}); "
            "from agent.server import main; main()")
    return ["-I", "-S", "-c", code]


def stage_agent() -> str:
    """A world-readable copy of the agent package (a rootless engine cannot read a 0700 home)."""
    sources = sorted(Path(AGENT_PARENT, "agent").glob("*.py"))
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sources)).hexdigest()[:16]
    staged = Path(tempfile.gettempdir()) / f"toolseam-agent-{digest}"
    if not (staged / "agent" / "server.py").exists():
        work = Path(tempfile.mkdtemp(prefix="toolseam-agent-stage-"))
        (work / "agent").mkdir()
        for source in sources:
            shutil.copyfile(source, work / "agent" / source.name)
        for path in (work, work / "agent"):
            path.chmod(0o755)
        for path in (work / "agent").iterdir():
            path.chmod(0o644)
        try:
            work.rename(staged)
        except OSError:  # another session staged it first
            shutil.rmtree(work, ignore_errors=True)
    return str(staged)


class LocalAgent:
    """The host backend's agent process and its channel."""

    def __init__(self, python: str) -> None:
        self._python = python
        self.channel: AgentChannel | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._stderr_tail: deque[str] = deque(maxlen=20)
        self._stderr_task: asyncio.Task[None] | None = None

    @property
    def launcher_pid(self) -> int | None:
        """The process this machine started (``unshare``, or the agent before it daemonised)."""
        return None if self._process is None else self._process.pid

    async def start(self, namespace: bool) -> dict[str, Any]:
        """Start the agent; returns its ``hello`` answer (raises CouldNotRunError)."""
        boot = [self._python, *agent_command(AGENT_PARENT)]
        if namespace:
            user = [] if os.geteuid() == 0 else ["--user", "--map-current-user"]
            argv = ["unshare", *user, "--pid", "--fork", "--mount-proc", "--kill-child", *boot]
        else:
            argv = [*boot, "--daemonize"]
        # The agent is an ancestor of every command: it must carry no host secret.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        # One socketpair carries the protocol both ways (the agent's stdin and stdout): a
        # round trip over a socket is measurably cheaper than over two pipes.
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._process = await asyncio.create_subprocess_exec(
                *argv, stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=asyncio.subprocess.PIPE,
                env=env, close_fds=True)
        except OSError as exc:
            ours.close()
            raise CouldNotRunError(f"{argv[0]}: {exc.strerror}", retryable=False) from None
        finally:
            theirs.close()
        assert self._process.stderr
        self._stderr_task = asyncio.get_running_loop().create_task(
            self._collect_stderr(self._process.stderr))
        self.channel = await AgentChannel.over_socket(ours, "host agent")
        try:
            return await asyncio.wait_for(self.channel.call(wire.HELLO), _START_TIMEOUT_S)
        except (CouldNotRunError, TimeoutError) as exc:
            detail = " | ".join(self._stderr_tail) or str(exc)
            raise CouldNotRunError(detail, retryable=False) from None

    async def _collect_stderr(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self._stderr_tail.append(line.decode("utf-8", "replace").rstrip())

    async def stop(self) -> None:
        """Shut the agent down (it kills every job first) and reap its process."""
        channel, process, stderr_task = self.channel, self._process, self._stderr_task
        self.channel = self._process = self._stderr_task = None
        if channel is not None:
            await channel.shutdown()
        if process is not None:
            try:
                await asyncio.wait_for(process.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()  # --kill-child takes the namespace down with it
                await process.wait()
        if stderr_task is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stderr_task, 5)
