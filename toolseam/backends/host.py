"""The host backend: files on this machine, in-process; commands through a per-session agent.

File operations call the agent's code directly (a read costs an ``open`` and a ``read``, no
hop). Commands go to one long-lived agent process per session, started in a private pid
namespace (``unshare --pid --fork --mount-proc``; ``--user --map-current-user`` when not root):

* commands cannot see the host's processes, so no ``/proc/<ancestor>/environ`` leaks the
  host's secrets — the agent (pid 1 there) was started with an empty environment;
* nor uncover them: the agent then enters a user namespace of its own (``agent/userns.py``)
  whose mounts are locked, so not even a root host's commands can unmount that ``/proc``;
* every orphan (``setsid``, double fork) is re-parented to the agent, which kills whole jobs;
* when the host dies, the channel closes, the agent kills every job, and the kernel kills
  whatever is left in the namespace with it.

Where no namespace can be had (``unshare`` missing or refused), the agent runs as a
daemonised subreaper instead: orphans are still caught, and the host is not an ancestor of any
command, but commands can see other processes. ``SandboxInfo.pid_namespace`` says which.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys

from ..seam.errors import ConfigurationError, CouldNotRunError
from ..seam.models import SandboxInfo, SyncReport
from ._channel import AgentChannel
from ._parts import AgentExec, ComposedBackend, LocalFiles
from .boot import LocalAgent

_log = logging.getLogger("toolseam")


class HostBackend(ComposedBackend):
    """Runs on this machine. ``pid_namespace``: True requires one, False never tries,
    None (default) uses one when the system allows it."""

    name = "host"

    def __init__(self, workspace: str | None = None, *, pid_namespace: bool | None = None,
                 python: str | None = None) -> None:
        super().__init__(LocalFiles(self._opened_agent), AgentExec(self._agent))
        self.workspace = os.path.abspath(workspace or os.getcwd())
        self._want_namespace = pid_namespace
        self.agent = LocalAgent(python or sys.executable)
        self._opening: asyncio.Lock | None = None

    def _sandbox_gone(self) -> bool:
        channel = self.agent.channel
        return self._info is not None and (channel is None or not channel.alive)

    async def _opened_agent(self) -> AgentChannel:
        await self.open()
        return self._agent()

    def _agent(self) -> AgentChannel:
        if self.agent.channel is None:
            raise CouldNotRunError("the host agent is not running", retryable=True)
        return self.agent.channel

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
                hello = await self.agent.start(namespace)
            except CouldNotRunError as exc:
                failure = exc.reason
                await self.agent.stop()
                continue
            if namespace and hello.get("proc_locked") is False:
                _log.warning("host agent: no user namespace could be had, so a command running "
                             "as root can unmount /proc and see this process: %s",
                             " | ".join(self.agent.stderr_tail))
            return SandboxInfo(backend=self.name, workspace=self.workspace, local=True,
                               pid_namespace=bool(hello.get("pid_namespace")),
                               agent_pid=int(hello["pid"]))
        raise CouldNotRunError(f"cannot start the host agent: {failure}", retryable=False)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.agent.stop()

    # --- transfer: the workspace is the host dir itself ----------------------------------
    async def sync(self) -> SyncReport:
        return SyncReport()  # nothing to bring home: commands work in the host dir

    async def upload(self, local: str, dest: str) -> None:
        await asyncio.to_thread(_copy, local, self._inside(dest), "upload")

    async def download(self, src: str, local: str) -> None:
        await asyncio.to_thread(_copy, self._inside(src), local, "download")

    def _inside(self, path: str) -> str:
        full = os.path.normpath(os.path.join(self.workspace, path))
        if not full.startswith(self.workspace + os.sep):
            raise ConfigurationError(f"{path!r} is not below the workspace {self.workspace}")
        return full


def _copy(source: str, target: str, what: str) -> None:
    """A file or directory, symlinks as symlinks, to a target that does not exist yet."""
    if not os.path.lexists(source):
        raise ConfigurationError(f"{what}: {source} does not exist")
    if os.path.lexists(target):
        raise ConfigurationError(f"{what}: {target} already exists")
    if os.path.isdir(source) and not os.path.islink(source):
        shutil.copytree(source, target, symlinks=True)
    else:
        shutil.copy2(source, target, follow_symlinks=False)
