"""``SyncToolkit``: the same session for synchronous code — plain threads, and frameworks whose
"sync tools" run inside an event loop (LangChain, a sync tool in an async agent).

Why a thread of our own: a ``Toolkit`` holds loop-bound things (the agent channel, locks,
the jobs' tasks). ``asyncio.run`` per call makes a new loop each time, so the second call meets
objects "attached to a different loop"; and a caller that already runs a loop cannot run ours
on its thread. One background loop in one daemon thread owns the toolkit for its whole life,
and every call is handed to it (``run_coroutine_threadsafe``) and waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar, Unpack

from ..builtins import ToolResult
from ..observability import SessionReport
from ..policy.shells import ShellChoice
from ..seam.errors import CouldNotRunError, SessionClosedError
from ..seam.handle import SessionHandle
from ..seam.models import SandboxInfo, SyncReport
from ..seam.protocol import BuiltinExec
from .declarations import Format
from .options import ToolkitOptions
from .toolkit import Toolkit

if TYPE_CHECKING:
    from ..backends.snapshots import RestoreResult, Snapshot

T = TypeVar("T")


class SyncToolkit:
    """``Toolkit``'s constructor and calls, blocking. Use it as a context manager, or call
    ``close()``; closing kills every job and stops the background loop.

    The keyword options are ``Toolkit``'s (``ToolkitOptions``), passed through unchanged; see
    ``Toolkit`` for what each does. ``backend``: ``"host"`` (default), a name of the backend
    table (``toolseam.backends.KINDS``) or a backend instance.
    """

    def __init__(self, backend: BuiltinExec | str = "host",
                 **options: Unpack[ToolkitOptions]) -> None:
        args = (backend,)
        kwargs: dict[str, Any] = dict(options)
        self._start_loop()
        try:
            # built on the loop's thread: whatever it binds to a loop binds to ours
            self.toolkit: Toolkit = self._run(self._build(args, kwargs))
        except BaseException:
            self._stop()
            raise

    def _start_loop(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="toolseam-sync",
                                        daemon=True)
        self._thread.start()
        self._closed = False
        self._owns_loop = True

    # --- branches (docs/branching.md): Toolkit's, blocking ---------------------------------
    def snapshot(self, label: str | None = None) -> Snapshot:
        return self._run(self.toolkit.snapshot(label))

    def restore(self, snapshot: Snapshot | str) -> RestoreResult:
        return self._run(self.toolkit.restore(snapshot))

    def keep(self) -> SyncReport:
        return self._run(self.toolkit.keep())

    def fork(self, n: int) -> list[SyncToolkit | CouldNotRunError]:
        """``Toolkit.fork``; the children run on this object's background thread, so close
        them before this one."""
        return [child if isinstance(child, CouldNotRunError) else self._on_our_loop(child)
                for child in self._run(self.toolkit.fork(n))]

    def _on_our_loop(self, toolkit: Toolkit) -> SyncToolkit:
        sync = SyncToolkit.__new__(SyncToolkit)
        sync._loop, sync._thread, sync._closed, sync._owns_loop = (self._loop, self._thread,
                                                                    False, False)
        sync.toolkit = toolkit
        return sync

    # --- sessions that outlive their client (docs/sessions.md) ---------------------------
    @property
    def handle(self) -> SessionHandle:
        """``Toolkit.handle``."""
        return self.toolkit.handle

    def detach(self) -> SessionHandle:
        """``Toolkit.detach``: the sandbox goes on; this object's thread ends."""
        handle = self._run(self.toolkit.detach())
        self._stop()
        return handle

    @classmethod
    def attach(cls, handle: SessionHandle | str, **options: Any) -> SyncToolkit:
        """``Toolkit.attach``, for synchronous code."""
        sync = cls.__new__(cls)
        sync._start_loop()
        try:
            sync.toolkit = sync._run(Toolkit.attach(handle, **options))
        except BaseException:
            sync._stop()
            raise
        return sync

    @staticmethod
    async def _build(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Toolkit:
        return Toolkit(*args, **kwargs)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coroutine.close()
            raise SessionClosedError("the toolkit was closed")
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("SyncToolkit called from its own loop; await Toolkit instead")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def open(self) -> SandboxInfo:
        return self._run(self.toolkit.open())

    def call(self, name: str, args: Any, *, call_id: str | None = None) -> ToolResult:
        """One tool call (see ``Toolkit.call``); live output goes to the toolkit's
        ``on_output`` callback, called on the background thread."""
        return self._run(self.toolkit.call(name, args, call_id=call_id))

    def end_turn(self) -> list[int]:
        return self._run(self.toolkit.end_turn())

    def pin_shell(self) -> ShellChoice:
        return self._run(self.toolkit.pin_shell())

    def user_message(self, text: str) -> None:
        self.toolkit.user_message(text)

    def declarations(self, fmt: Format) -> list[dict[str, Any]]:
        return self.toolkit.declarations(fmt)

    @property
    def tool_names(self) -> list[str]:
        return self.toolkit.tool_names

    def close(self) -> SessionReport:
        """Close the session (see ``Toolkit.close``); returns what it used."""
        if self._closed:
            report = self.toolkit.report
            assert report is not None  # the toolkit closed or detached with this object
            return report
        try:
            return self._run(self.toolkit.close())
        finally:
            self._closed = True
            self._stop()

    def _stop(self) -> None:
        self._closed = True
        if not self._owns_loop:  # a fork's child: the loop is its parent's
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> SyncToolkit:
        try:
            self.open()
        except BaseException:
            self.close()  # a refused open (a missing base dir …) leaves no thread behind
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __del__(self) -> None:
        # a forgotten SyncToolkit still closes its sandbox (no orphaned processes/containers)
        if not getattr(self, "_closed", True) and self._thread.is_alive():
            with contextlib.suppress(Exception):  # nothing may escape a finaliser
                self.close()
