"""The one way a command's process is started: ``posix_spawn`` as a session leader, every
signal back to its default, on the set-id guard's thread.

Called inside a job's root (``jobroot.py``), which is forked from that thread and so carries
its filter and Landlock domain; the pty and raw paths come through here too.
"""

from __future__ import annotations

import os
import shutil
import signal
from typing import Any

from .setid_guard import start_command


class SpawnError(Exception):
    def __init__(self, exc: OSError, cwd: str) -> None:
        super().__init__(str(exc))
        self.errno = exc.errno or 0
        self.in_cwd = bool(cwd) and exc.filename == cwd
        self.strerror = exc.strerror or str(exc)


# Every signal back to its default in the command. Without this the agent's own dispositions
# leak in: Python ignores SIGPIPE and SIGXFSZ, so `yes | head -1` printed "Broken pipe". Naming
# them all is also cheaper: glibc then sets each once instead of querying and setting each.
DEFAULT_SIGNALS = frozenset(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}

_cwd: str | None = None  # where this process's main thread is; file ops never use the cwd


def program_of(argv: list[str], env: dict[str, str]) -> str:
    """``argv[0]`` looked up in the command's own PATH."""
    return argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH")) or argv[0]


def spawn(argv: list[str], cwd: str, env: dict[str, str], writers: tuple[int, int]) -> int:
    """Start ``argv`` as a session leader with stdin /dev/null and stdout/stderr on the pipes'
    write ends ``writers`` (the caller's to close); its pid.

    ``posix_spawn`` (a vfork-style clone) rather than ``subprocess.Popen``: it is measurably
    cheaper per command, and this is the hot path of every bash call. It has no chdir action in
    Python, so the process changes into the job's directory first — safe because every file
    operation of the agent uses absolute paths or dir fds, never the cwd.
    """
    actions = [(os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
               (os.POSIX_SPAWN_DUP2, writers[0], 1), (os.POSIX_SPAWN_DUP2, writers[1], 2)]
    return spawn_with(argv, cwd, env, actions)


def spawn_with(argv: list[str], cwd: str, env: dict[str, str], actions: list[Any]) -> int:
    """``spawn`` with the caller's file actions for the descriptors 0-2 (an interactive
    process's terminal: ``pty_procs.py``) — the same guard thread, signals and session."""
    global _cwd
    if cwd != _cwd:  # stay where the last job ran: most calls share one cwd
        try:
            os.chdir(cwd)
        except OSError as exc:
            _cwd = None
            raise SpawnError(exc, cwd) from None
        _cwd = cwd
    try:
        # on the set-id guard's thread in a container (setid_guard): it carries the filter
        return start_command(lambda: os.posix_spawn(
            program_of(argv, env), argv, env, file_actions=actions, setsid=True,
            setsigdef=DEFAULT_SIGNALS, setsigmask=()))
    except OSError as exc:
        raise SpawnError(exc, "") from None
