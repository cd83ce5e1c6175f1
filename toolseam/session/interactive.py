"""Interactive processes in the raw sandbox API (``tools.sandbox.pty_*``): a program on a
terminal in the sandbox, written to and read from over many calls — a REPL, a ``sudo``-style
prompt, ``top`` or ``vi``, a dev server whose output is read as it comes.

It starts like ``tools.sandbox.exec``'s commands (the session's environment plus ``env``, its
limits, network and guards: ``toolseam_agent/pty_procs.py``) with ``TERM=xterm-256color``
unless ``env`` says otherwise. Each backend says whether it can (``InteractiveProcesses`` in
``seam/capabilities.py``); one that cannot raises ``InteractiveUnsupportedError``.
docs/raw-sandbox.md has the whole contract.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence

from ..seam.capabilities import InteractiveProcesses, interactive_processes, supports_interactive
from ..seam.errors import FileOpError
from ..seam.interactive import (
    DEFAULT_COLS,
    DEFAULT_ROWS,
    MAX_READ_BYTES,
    InteractiveLimitError,
    InteractiveUnsupportedError,
    ProcessExitedError,
    PtyOutput,
    PtyProcess,
    UnknownProcessError,
)
from ..seam.models import MAX_MS
from .raw_checks import checked_argv, checked_env, os_error
from .toolkit_view import ToolkitView

TERM = "xterm-256color"
_SIZE_VARS = ("LINES", "COLUMNS")


class InteractiveSandbox:
    """The ``pty_*`` half of ``RawSandbox`` (which brings ``_tk``, the session)."""

    _tk: ToolkitView

    @property
    def supports_pty(self) -> bool:
        """Whether this session's backend runs interactive processes."""
        return supports_interactive(self._tk.backend)

    async def _processes(self) -> InteractiveProcesses:
        await self._tk.open()
        return interactive_processes(self._tk.backend)

    async def pty_start(self, argv: Sequence[str], *, cwd: str | None = None,
                        env: Mapping[str, str] | None = None, rows: int = DEFAULT_ROWS,
                        cols: int = DEFAULT_COLS, tty: bool = True) -> int:
        """Start ``argv`` on a terminal of ``rows`` x ``cols`` (``tty=False``: on pipes, no
        echo, no Ctrl-C); its id for the other calls. At most 64 run at once per session;
        every one ends with the session (a detached durable session keeps them).

        Raises:
            ValueError: a malformed argument.
            FileNotFoundError: ``cwd`` does not exist.
            InteractiveLimitError: 64 are running already.
            InteractiveUnsupportedError: the backend has none.
            CouldNotRunError: it could not be started (a program that is not there, say).
        """
        args = checked_argv(argv)
        extra = checked_env(env)
        _check_size(rows, cols)
        processes = await self._processes()
        tk = self._tk
        workdir = posixpath.normpath(posixpath.join(tk.base_dir, cwd or "."))
        if "\0" in workdir:
            raise ValueError("cwd must not contain a NUL byte")
        # LINES and COLUMNS from the host's environment would win over the terminal's real
        # size in curses and readline programs (and stay wrong after a resize): only the
        # caller's own env may set them
        inherited = {k: v for k, v in tk.services.command_env.items() if k not in _SIZE_VARS}
        try:
            return await processes.pty_start(args, workdir, {**inherited, "TERM": TERM, **extra},
                                             rows, cols, tty)
        except FileOpError as exc:
            raise os_error(exc, cwd or workdir) from None

    async def pty_write(self, pty: int, data: bytes | str) -> None:
        """Type ``data`` (text as UTF-8; ``"\\x03"`` is Ctrl-C, ``"\\x04"`` Ctrl-D at a
        line's start); returns once the terminal took it.

        Raises: UnknownProcessError, ProcessExitedError, InteractiveLimitError (over 1 MiB
        waiting to be read by the program), InteractiveUnsupportedError.
        """
        payload = data.encode() if isinstance(data, str) else bytes(data)
        await (await self._processes()).pty_write(int(pty), payload)

    async def pty_read(self, pty: int, *, yield_ms: int = 1000,
                       max_bytes: int = 1 << 20) -> PtyOutput:
        """Output not read yet (at most ``max_bytes``): at once when there is some, else once
        some comes, the process ends, or ``yield_ms`` passes. ``exited`` with ``exit_code``
        once it ended and this read took its last output (the id is forgotten then);
        ``truncated_bytes``: output dropped since the last read (1 MiB is kept).

        Raises: ValueError, UnknownProcessError, InteractiveUnsupportedError.
        """
        if not 0 <= yield_ms <= MAX_MS:
            raise ValueError(f"yield_ms must be 0 to {MAX_MS}, got {yield_ms}")
        if not 0 < max_bytes <= MAX_READ_BYTES:
            raise ValueError(f"max_bytes must be 1 to {MAX_READ_BYTES}, got {max_bytes}")
        return await (await self._processes()).pty_read(int(pty), int(yield_ms), int(max_bytes))

    async def pty_resize(self, pty: int, rows: int, cols: int) -> None:
        """Resize its terminal; the program gets SIGWINCH.

        Raises: ValueError, UnknownProcessError, InteractiveUnsupportedError.
        """
        _check_size(rows, cols)
        await (await self._processes()).pty_resize(int(pty), rows, cols)

    async def pty_terminate(self, pty: int) -> int | None:
        """Hang it up — SIGHUP to its process group and everything it started, SIGKILL to
        what is left a second later — and forget it. Its exit status (negative: the signal)
        when it was learnt.

        Raises: UnknownProcessError, InteractiveUnsupportedError.
        """
        return await (await self._processes()).pty_terminate(int(pty))

    async def pty_list(self) -> list[PtyProcess]:
        """The interactive processes the sandbox has — after an attach, what an earlier
        client started."""
        return await (await self._processes()).pty_list()


def _check_size(rows: int, cols: int) -> None:
    if not (isinstance(rows, int) and isinstance(cols, int) and 0 < rows < 1 << 16
            and 0 < cols < 1 << 16):
        raise ValueError(f"rows and cols must be whole numbers from 1 to 65535, got "
                         f"{rows!r} x {cols!r}")


__all__ = ["InteractiveLimitError", "InteractiveSandbox", "InteractiveUnsupportedError",
           "ProcessExitedError", "PtyOutput", "PtyProcess", "UnknownProcessError"]
