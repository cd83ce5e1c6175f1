"""What the framework providers share: how their arguments become a ``Toolkit``, and the
event loop on a thread of its own that the toolkit lives in.

Why a loop of our own: a ``Toolkit`` belongs to the loop that opened it, and a framework's
sandbox object outlives any one loop — deepagents calls it from plain threads and from async
code, pydantic-ai's test suites and durable engines from a new loop per call. Every call is
handed to the provider's loop; an async caller awaits it without blocking its own loop, and
cancelling that await cancels the call on ours (the raw API then kills the command).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

from ..backends import BACKENDS, backend_kind
from ..seam.errors import ConfigurationError, SessionClosedError

T = TypeVar("T")



class LoopThread:
    """An event loop running on a daemon thread, until ``stop``."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self.stopped = False

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for it (from any thread but the loop's)."""
        self._refuse_if_unusable(coroutine)
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def submit(self, coroutine: Coroutine[Any, Any, T], *, shielded: bool = False) -> T:
        """Await ``coroutine`` on the loop from another loop; cancelling this cancels it,
        unless ``shielded`` (it then runs to its end: an open whose result must be kept)."""
        self._refuse_if_unusable(coroutine)
        if asyncio.get_running_loop() is self._loop:
            return await coroutine
        future = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, self._loop))
        return await (asyncio.shield(future) if shielded else future)

    def _refuse_if_unusable(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        if self.stopped:
            coroutine.close()
            raise SessionClosedError("the sandbox was closed")
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("called from the provider's own loop; await the async form")

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()


class Workspace:
    """The host directory a session works in: the caller's, or a private temporary one this
    session makes at open and removes when the sandbox ends."""

    def __init__(self, given: str | os.PathLike[str] | None, made: str | None = None) -> None:
        self.given = None if given is None else os.fspath(given)
        self.made = made  # a directory made for this session (an attach learns it)

    def path(self) -> str:
        if self.given is not None:
            return self.given
        if self.made is None:
            self.made = tempfile.mkdtemp(prefix="toolseam-workspace-")
        return self.made

    def remove(self) -> None:
        if self.made is not None:
            shutil.rmtree(self.made, ignore_errors=True)
            self.made = None


def check_choice(backend: str, image: str | None) -> None:
    """Refuse a backend name or an image that cannot work, before anything is made."""
    if backend not in BACKENDS:
        raise ConfigurationError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, "
                                 f"got {backend!r}")
    if not backend_kind(backend).contained and image is not None:
        raise ConfigurationError("image is for a container backend (podman, docker); the host "
                                 "backend runs on this machine")


def toolkit_arguments(backend: str, image: str | None, workspace: Workspace,
                      options: Mapping[str, Any]) -> dict[str, Any]:
    """``Toolkit`` keyword arguments from a provider's: ``image`` goes to the container
    backend, the workspace is the host's base dir or the directory the container binds."""
    check_choice(backend, image)
    arguments = dict(options)
    backend_options = dict(arguments.pop("backend_options", None) or {})
    if not backend_kind(backend).contained:
        arguments.setdefault("base_dir", workspace.path())
    else:
        if image is not None:
            backend_options["image"] = image
        backend_options.setdefault("workspace", workspace.path())
    arguments["backend_options"] = backend_options
    return arguments
