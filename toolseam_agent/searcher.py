"""Searches in a child process the agent can kill: a regex that backtracks without end (Python's
``re`` holds the interpreter lock while it matches) must never freeze the agent's loop —
its job deadlines, output and other calls — and must stop at the search's deadline.

The child is forked (about a millisecond; a fresh interpreter would cost 20 ms per search),
runs the walk, writes one JSON answer to a pipe and exits. The agent reads the pipe on its
loop; at the deadline it kills the child with SIGKILL. The pattern is compiled in the child
too: compiling can take longer than searching (a case-insensitive class over all of Unicode
costs 16 ms, a 20 MB alternation a minute), and the deadline bounds the whole search.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import Callable
from typing import Any

from . import paths, wire
from .errors import FsError
from .jobs import HELD_WRITERS
from .loop import Loop, Timer
from .wire import ErrorKind

TIMEOUT = "timeout"
BAD_PATTERN = "bad_pattern"  # the regex does not compile; path holds the pattern


class Search:
    """One running search; ``done`` gets ``(result, None)`` or ``(None, error dict)``."""

    def __init__(self, loop: Loop, run: Callable[[], dict[str, Any]], deadline_s: float | None,
                 done: Callable[[dict[str, Any] | None, wire.ErrorBody | None], None],
                 path: str) -> None:
        self._loop = loop
        self._done = done
        self._path = path
        self._chunks: list[bytes] = []
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: search, answer, exit — never return into the agent
            _child(read_fd, write_fd, run)
        os.close(write_fd)
        self._fd = read_fd
        os.set_blocking(read_fd, False)
        loop.add_reader(read_fd, self._on_readable)
        self._timer: Timer | None = None
        if deadline_s is not None:
            self._timer = loop.call_later(deadline_s, self._on_deadline)
        self._deadline_ms = int((deadline_s or 0) * 1000)

    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        if data:
            self._chunks.append(data)
            return
        self._finish()
        try:
            answer = json.loads(b"".join(self._chunks))
        except ValueError:
            self._done(None, wire.error(ErrorKind.AGENT, "the search process died"))
            return
        if "error" in answer:
            self._done(None, answer["error"])
        else:
            self._done(answer["result"], None)

    def _on_deadline(self) -> None:
        self._timer = None
        self.kill()
        self._finish()
        error = FsError(TIMEOUT, self._path, str(self._deadline_ms))
        self._done(None, wire.error(ErrorKind.FS, str(error), **error.to_wire()))

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def _finish(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1


def _child(read_fd: int, write_fd: int, run: Callable[[], dict[str, Any]]) -> None:
    status = 0
    try:
        os.close(read_fd)
        for fd in list(HELD_WRITERS):  # running jobs' pipes must end when their commands do
            os.close(fd)
        signal.set_wakeup_fd(-1)  # the agent's wakeup pipe is not ours to write
        # A lock another agent thread held at the fork stays held forever in this copy: the
        # ones a walk takes are made anew.
        paths.reset_locks_after_fork()
        try:
            answer: dict[str, Any] = {"result": run()}
        except FsError as exc:
            answer = {"error": wire.error(ErrorKind.FS, str(exc), **exc.to_wire())}
        except re.error as exc:  # the pattern is compiled here, under the search's deadline
            bad = FsError(BAD_PATTERN, str(exc.pattern or ""), str(exc))
            answer = {"error": wire.error(ErrorKind.FS, str(bad), **bad.to_wire())}
        except Exception as exc:  # noqa: BLE001 - reported to the host as an agent fault
            answer = {"error": wire.error(ErrorKind.AGENT, f"{type(exc).__name__}: {exc}")}
        view = memoryview(json.dumps(answer, separators=(",", ":")).encode())
        while view:
            view = view[os.write(write_fd, view):]
        # EOF now: left to _exit, the pipe would close only after the kernel has torn down
        # this forked copy of the agent's address space, which the answer need not wait for.
        os.close(write_fd)
    except BaseException:  # noqa: BLE001 - the child must exit whatever happened
        status = 1
    finally:
        os._exit(status)
