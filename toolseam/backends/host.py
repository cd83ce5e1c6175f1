"""The host backend: files on this machine, in-process; commands through a per-session agent.

File operations call the agent's code directly (a read costs an ``open`` and a ``read``, no
hop). Commands go to one long-lived agent process per session, started in a private pid
namespace (``unshare --pid --fork --mount-proc``; ``--user --map-current-user`` when not root):

* commands cannot see the host's processes, so no ``/proc/<ancestor>/environ`` leaks the
  host's secrets — the agent (pid 1 there) was started with an empty environment;
* every orphan (``setsid``, double fork) is re-parented to the agent, which kills whole jobs;
* when the host dies, the channel closes, the agent kills every job, and the kernel kills
  whatever is left in the namespace with it.

Where no namespace can be had (``unshare`` missing or refused), the agent runs as a
daemonised subreaper instead: orphans are still caught, and the host is not an ancestor of any
command, but commands can see other processes. ``SandboxInfo.pid_namespace`` says which.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
from collections import deque
from pathlib import Path
from typing import Any

from ..seam.errors import CouldNotRunError
from ..seam.models import SandboxInfo
from ._channel import AgentChannel
from ._parts import AgentExec, ComposedBackend, LocalFiles

AGENT_PARENT = str(Path(__file__).resolve().parent)  # holds the agent/ package
_START_TIMEOUT_S = 10.0


def agent_boot(parent: str) -> list[str]:
    """``python -c`` arguments that run the agent package found in ``parent``."""
    code = (f"import sys; sys.path.insert(0, {parent!r}); "
            "from agent.server import main; main()")
    return ["-I", "-S", "-c", code]


class HostBackend(ComposedBackend):
    """Runs on this machine. ``pid_namespace``: True requires one, False never tries,
    None (default) uses one when the system allows it."""

    name = "host"

    def __init__(self, workspace: str | None = None, *, pid_namespace: bool | None = None,
                 python: str | None = None) -> None:
        super().__init__(LocalFiles(self._opened_agent), AgentExec(self._agent))
        self.workspace = os.path.abspath(workspace or os.getcwd())
        self._want_namespace = pid_namespace
        self._python = python or sys.executable
        self._channel: AgentChannel | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._stderr_tail: deque[str] = deque(maxlen=20)
        self._opening: asyncio.Lock | None = None
        self._stderr_task: asyncio.Task[None] | None = None

    def _sandbox_gone(self) -> bool:
        return self._info is not None and (self._channel is None or not self._channel.alive)

    async def _opened_agent(self) -> AgentChannel:
        await self.open()
        return self._agent()

    def _agent(self) -> AgentChannel:
        if self._channel is None:
            raise CouldNotRunError("the host agent is not running", retryable=True)
        return self._channel

    async def open(self) -> SandboxInfo:
        self._check_open()
        if self._info is not None:
            return self._info
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._info is None:
                self._info = await self._start_agent()
        return self._info

    async def _start_agent(self) -> SandboxInfo:
        attempts = [True, False] if self._want_namespace is None else [self._want_namespace]
        if attempts[0] and shutil.which("unshare") is None:
            attempts = [False] if self._want_namespace is None else attempts
        failure = ""
        for namespace in attempts:
            try:
                hello = await self._spawn_agent(namespace)
            except CouldNotRunError as exc:
                failure = exc.reason
                await self._stop_agent()
                continue
            return SandboxInfo(backend=self.name, workspace=self.workspace, local=True,
                               pid_namespace=bool(hello.get("pid_namespace")),
                               agent_pid=int(hello["pid"]))
        raise CouldNotRunError(f"cannot start the host agent: {failure}", retryable=False)

    async def _spawn_agent(self, namespace: bool) -> dict[str, Any]:
        boot = [self._python, *agent_boot(AGENT_PARENT)]
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
                *argv, stdin=theirs.fileno(), stdout=theirs.fileno(), stderr=asyncio.subprocess.PIPE, env=env,
                close_fds=True)
        except OSError as exc:
            ours.close()
            raise CouldNotRunError(f"{argv[0]}: {exc.strerror}", retryable=False) from None
        finally:
            theirs.close()
        assert self._process.stderr
        self._stderr_task = asyncio.get_running_loop().create_task(
            self._collect_stderr(self._process.stderr))
        self._channel = await AgentChannel.over_socket(ours, "host agent")
        try:
            hello = await asyncio.wait_for(self._channel.call("hello"), _START_TIMEOUT_S)
        except (CouldNotRunError, TimeoutError) as exc:
            detail = " | ".join(self._stderr_tail) or str(exc)
            raise CouldNotRunError(detail, retryable=False) from None
        return hello

    async def _collect_stderr(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self._stderr_tail.append(line.decode("utf-8", "replace").rstrip())

    async def _stop_agent(self) -> None:
        channel, process, stderr_task = self._channel, self._process, self._stderr_task
        self._channel = self._process = self._stderr_task = None
        if channel is not None:
            if channel.alive:
                with contextlib.suppress(CouldNotRunError, TimeoutError):
                    await asyncio.wait_for(channel.call("shutdown"), 5)
            await channel.close()  # returns at EOF: the agent has killed its jobs and exited
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

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._stop_agent()
