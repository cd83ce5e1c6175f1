"""The host backend's durable agent: a process that outlives the client that started it.

Like ``host.LocalAgent`` it runs ``python -I -S -B <staged agent>`` in a private pid namespace,
but in a session of its own (no signal to the client's process group reaches it), started with
``subprocess.Popen`` — an asyncio subprocess transport kills its child when it is closed — and
reached over a unix socket, 0600 in a 0700 directory, where every connection must prove it
knows the session's key (``toolseam_agent/session_socket.py``). A client that ``attach``es to a
handle starts nothing: it connects to that socket.

The session directories live in this user's ``toolseam-sessions-<uid>`` (0700, checked along
the path like the staging root), which the agent covers with an empty tmpfs in its commands'
mount namespace (locked: no command can lift it): a client outside sees the socket, a command
sees nothing it could rename or replace.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Any

from ..seam.errors import CouldNotRunError
from ..seam.lifetime import Durable
from .agentlink.durable import DurableChannel, durable_agent_env
from .agentlink.launch import agent_command, stage_agent
from .staging import UnsafePath, check_ancestors, check_owned

_START_TIMEOUT_S = 10.0
SOCKET_DIR_PREFIX = "toolseam-session-"


SESSIONS_ROOT_PREFIX = "toolseam-sessions-"


def socket_parent() -> str:
    """Where this user's session sockets live: the runtime dir when there is one."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return runtime if runtime and os.path.isdir(runtime) else tempfile.gettempdir()


def sessions_root(parent: str) -> str:
    """``parent/toolseam-sessions-<uid>``: made 0700 if missing, and only used when it is a
    directory of this user's that no one else may write, on a path no one else may change."""
    uid = os.geteuid()
    root = Path(parent) / f"{SESSIONS_ROOT_PREFIX}{uid}"
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    try:
        check_ancestors(root, uid)
        check_owned(root, uid, exact_owner=True)
    except (UnsafePath, OSError) as exc:
        raise CouldNotRunError(f"the sessions directory {root} is not safe to use: {exc} "
                               "(remove it, or set XDG_RUNTIME_DIR to a directory of yours)",
                               retryable=False) from None
    return str(root)


class DurableHostAgent:
    """The same surface as ``host.LocalAgent`` (``channel``, ``start``, ``stop``,
    ``stderr_tail``, ``launcher_pid``), for a session that outlives its client."""

    def __init__(self, python: str, lifetime: Durable) -> None:
        self.python = python
        adopt = lifetime.adopt
        self._secret = lifetime.secret
        self._orphan_timeout_s = lifetime.orphan_timeout_s
        self._adopt = adopt
        self.channel: DurableChannel | None = None
        self.socket_path = adopt.socket if adopt is not None else ""
        self._launched = False
        self._stderr_done = threading.Event()
        self._stderr_tail: deque[str] = deque(maxlen=20)

    @property
    def stderr_tail(self) -> list[str]:
        return list(self._stderr_tail)

    @property
    def launcher_pid(self) -> int | None:
        return None  # the launcher forked and exited: nothing of this process to wait for

    async def start(self, namespace: bool, own_network: bool = False) -> dict[str, Any]:
        """Start the agent (or attach to the handle's); its ``hello`` answer. With
        ``own_network`` (egress mode) the agent gets its network namespace and hides /run."""
        if self._adopt is None:
            await self._launch(namespace, own_network)
        else:
            self.channel = await DurableChannel.attach(self.socket_path, "host agent",
                                                       self._secret)
        return await self.channel.hello() if self.channel else {}

    async def _launch(self, namespace: bool, own_network: bool = False) -> None:
        boot = [self.python, *agent_command(await asyncio.to_thread(stage_agent))]
        # In egress mode the agent hides /run (the runtime dir with it) before it listens.
        parent = tempfile.gettempdir() if own_network else socket_parent()
        root = await asyncio.to_thread(sessions_root, parent)
        directory = tempfile.mkdtemp(prefix=SOCKET_DIR_PREFIX, dir=root)  # 0700
        self.socket_path = os.path.join(directory, "agent.sock")
        if namespace:
            user = [] if os.geteuid() == 0 else ["--user", "--map-current-user"]
            argv = ["unshare", *user, "--pid", "--fork", "--mount-proc", "--kill-child", *boot,
                    "--own-user-namespace", *(["--own-network"] if own_network else []),
                    "--durable", self.socket_path]
        else:
            argv = [*boot, "--daemonize", "--durable", self.socket_path]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
               **durable_agent_env(self._secret, self._orphan_timeout_s)}
        # setsid --fork: the agent is in a session of its own (no signal to this client's
        # process group reaches it) and no child of this process (nothing here waits for it)
        launcher = argv if not namespace else ["setsid", "--fork", *argv]
        try:
            process = subprocess.Popen(
                launcher, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, env=env, close_fds=True)
        except OSError as exc:
            shutil.rmtree(directory, ignore_errors=True)
            raise CouldNotRunError(f"{launcher[0]}: {exc.strerror}", retryable=False) from None
        assert process.stderr is not None
        self._stderr_done = threading.Event()
        threading.Thread(target=self._collect_stderr, args=(process.stderr,),
                         daemon=True, name="toolseam-agent-stderr").start()
        process.stderr = None  # the thread owns and closes it
        await asyncio.to_thread(process.wait)  # the launcher: it forks and is gone at once
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not os.path.exists(self.socket_path):
            # every holder of the stderr pipe gone before the socket: the agent died starting
            if time.monotonic() > deadline or self._stderr_done.is_set():
                detail = " | ".join(self._stderr_tail) or "it did not listen in time"
                shutil.rmtree(directory, ignore_errors=True)
                raise CouldNotRunError(detail, retryable=False)
            await asyncio.sleep(0.005)
        self._launched = True
        self.channel = await DurableChannel.attach(self.socket_path, "host agent", self._secret)

    def _collect_stderr(self, stream: IO[bytes]) -> None:
        with stream:
            for line in stream:
                self._stderr_tail.append(line.decode("utf-8", "replace").rstrip())
        self._stderr_done.set()

    async def detach(self) -> None:
        channel, self.channel = self.channel, None
        if channel is not None:
            await channel.detach()

    async def stop(self) -> None:
        """End the session: the agent kills every job and exits."""
        channel, self.channel = self.channel, None
        if channel is None and not self._launched:
            return  # never attached: the session (if any) is not ours to end
        if channel is not None:
            await channel.shutdown()
        if self._launched:  # the agent holds its stderr to the end: our reader's EOF is its exit
            await asyncio.to_thread(self._stderr_done.wait, 5)
        remove_socket_dir(self.socket_path)


def remove_socket_dir(socket_path: str) -> None:
    """The session's socket directory, once its agent is gone (only a directory we made)."""
    directory = os.path.dirname(socket_path)
    if os.path.basename(directory).startswith(SOCKET_DIR_PREFIX):
        with contextlib.suppress(OSError):
            os.unlink(socket_path)
        with contextlib.suppress(OSError):
            os.rmdir(directory)
