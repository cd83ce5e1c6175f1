"""``ContainerPool`` (``toolseam.SandboxPool`` adds ``toolkit()``): container sandboxes created,
started and answering before a session asks.

A pool holds ``size`` pre-warmed sandboxes of one backend class and one set of options (image,
limits, endpoint …): each container is running and its agent has answered ``hello``. A hand-out
gives one its session's workspace and returns it as an ordinary backend (or ``Toolkit``); the
pool refills in the background, at most ``refill_concurrency`` starts at a time. A sandbox
serves exactly one session and is destroyed when that session closes — never reused.

How the workspace arrives (docs/pool.md, decision 110):

* **bind** (a rootful engine on this machine, and this process may mount): the container was
  started with an empty slot directory at ``/workspace``, mounted with slave propagation; the
  base dir is bind-mounted onto the slot on the host (``pool/mounts.py``) and appears inside at
  once. The pool checks that the container sees it before handing it out.
* **copy** (everything else — rootless podman, whose mount namespace a host mount does not
  reach; an engine on another machine; a process that may not mount): the base dir is copied
  into the running container's workspace volume, and comes home at sync and close as in any
  copy-mode session.

A pool whose sandboxes cannot start says so at hand-out (``CouldNotRunError``, the engine's
reason), after one attempt made for that hand-out — never a hang, never a silent retry loop.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Literal, Self

from ....policy.limits import SandboxLimits
from ....seam.errors import ConfigurationError, CouldNotRunError, HostError
from ....seam.models import PathRef
from ..backend import ContainerBackend
from ..engine.protocol import in_engine_thread
from ..host_dirs import check_pool_base_dir
from ..labels import POOL_LABEL, WORKSPACE
from ..modes.bind import BindMode, socket_owner
from ..options import Pooled
from .mounts import (
    HOST_SLOTS,
    NamespaceSlots,
    SlotMounts,
    can_mount,
    make_pool_dir,
    make_slot,
    remove_pool_dir,
    rootless_namespace,
    slot_marker,
)

__all__ = ["ContainerPool"]

BackendFactory = Callable[..., ContainerBackend]


class ContainerPool:
    """Pre-warmed container sandboxes for new sessions, one backend class and its options.

    ``SandboxPool(PodmanBackend, size=16, image="my/sandbox:1", limits=SandboxLimits(...))``;
    use it as ``async with SandboxPool(...) as pool:`` — leaving it removes every sandbox the
    pool made, the ones handed out included — then ``await pool.toolkit(base_dir)`` per session.

    Args:
        backend_class: ``PodmanBackend``, ``DockerBackend`` (or a callable taking the workspace
            and the options and returning a ``ContainerBackend``).
        size: how many sandboxes to keep warm.
        refill_concurrency: how many sandboxes may be starting at once.
        refill: replace each sandbox handed out (default); ``False`` fills the pool once (a
            known burst) and afterwards starts a sandbox only for a hand-out that finds none.
        **backend_options: the backend's keyword options (``image``, ``endpoint``,
            ``rootless``, ``limits``, ``workspace_mode`` …). ``workspace_mode="bind"`` where
            the pool cannot bind (see the module's docstring) is a ``ConfigurationError``.
    """

    def __init__(self, backend_class: BackendFactory, *, size: int = 4,
                 refill_concurrency: int = 4, refill: bool = True,
                 **backend_options: Any) -> None:
        if size < 1:
            raise ConfigurationError(f"pool size must be at least 1, got {size}")
        if refill_concurrency < 1:
            raise ConfigurationError(
                f"refill_concurrency must be at least 1, got {refill_concurrency}")
        self.size = size
        self.refill_concurrency = refill_concurrency
        self.refill = refill
        self._filled_once = False  # without refill: filled to size once, then on demand only
        self.pool_id = uuid.uuid4().hex[:12]
        self._class = backend_class
        self._options = dict(backend_options)
        probe = backend_class(os.getcwd(), **self._options)  # validates the options; no I/O
        self.engine_name = probe.name
        self.limits: SandboxLimits | None = probe.options.limits
        self._slots = False  # bind mode: slots the base dir is mounted onto (pool/mounts.py)
        self._mounts: SlotMounts = HOST_SLOTS  # where: here, or rootless podman's namespace
        self.mode = self._choose_mode(probe)
        self._options["workspace_mode"] = self.mode
        self._dir: str | None = None
        self._ready: deque[ContainerBackend] = deque()
        self._handed: list[ContainerBackend] = []
        self._warming = 0
        self._waiting = 0  # hand-outs waiting for a sandbox
        self._tasks: set[asyncio.Task[None]] = set()
        self._changed: asyncio.Condition | None = None
        self._limit: asyncio.Semaphore | None = None
        self._failure: CouldNotRunError | None = None
        self._failures = 0  # how many starts failed: a waiter raises on one after it began
        self._closed = False
        self.started_count = 0  # sandboxes warmed since the pool started
        self.handed_count = 0  # sandboxes handed out

    def _choose_mode(self, probe: ContainerBackend) -> Literal["bind", "copy"]:
        """Decision 110: the base dir mounted into a running container where the engine's
        mode shares the host dir and this process can mount where the engine makes its
        containers (decision 114: rootless podman's own namespace); else a copy."""
        if not probe.sandbox.mode.shares_host_dir:
            return probe.workspace_mode
        endpoint = probe.sandbox.engine.endpoint
        why = None
        if not can_mount():
            why = "this process may not make bind mounts (it needs root)"
        elif socket_owner(endpoint) != 0:
            pid = rootless_namespace(endpoint.removeprefix("unix://"))
            if pid is None:
                why = (f"the {probe.name} engine does not run as root and its mount namespace "
                       "was not found: a mount made on the host does not reach its containers")
            else:
                self._mounts = NamespaceSlots(pid)
        if why is None:
            self._slots = True
            return probe.workspace_mode
        if self._options.get("workspace_mode", "auto") != "auto":
            raise ConfigurationError(f"a pool cannot hand out bind-mode sandboxes here: {why}; "
                                     "use workspace_mode='copy' (or 'auto')")
        return "copy"

    # --- lifecycle ----------------------------------------------------------------------
    async def start(self) -> Self:
        """Begin filling the pool (returns at once; ``wait_full`` waits). Idempotent."""
        if self._closed:
            raise HostError("the sandbox pool was closed")
        if self._changed is None:
            self._changed = asyncio.Condition()
            self._limit = asyncio.Semaphore(self.refill_concurrency)
            self._dir = await in_engine_thread(lambda: make_pool_dir(self._mounts if self._slots else None))
            self._top_up()
        return self

    async def wait_full(self) -> None:
        """Until ``size`` sandboxes are warm (without refill: until the first fill is done);
        raises the failure if one could not start."""
        await self.start()
        assert self._changed is not None
        # Like a hand-out, a wait tries again after a failure: a pool whose sandboxes had all
        # failed (none starting any more) left this waiting for a change that never came.
        self._failure = None
        failures = self._failures
        async with self._changed:
            while not self._full():
                if self._closed:
                    raise HostError("the sandbox pool was closed")
                if self._failures > failures and self._failure is not None:
                    raise self._failure
                self._top_up()
                await self._changed.wait()

    @property
    def ready_count(self) -> int:
        """Warm sandboxes waiting to be handed out now."""
        return len(self._ready)

    def _full(self) -> bool:
        if self.refill:
            return len(self._ready) >= self.size
        return self._filled_once or len(self._ready) >= self.size - self.handed_count

    async def close(self) -> None:
        """Remove every sandbox the pool made — warm, starting or handed out — and the pool's
        host directory (and its mounts)."""
        if self._closed:
            return
        self._closed = True
        if self._changed is not None:  # hand-outs and wait_full waiting: the pool is closed
            async with self._changed:
                self._changed.notify_all()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        backends = [*self._ready, *self._handed]
        self._ready.clear()
        self._handed.clear()
        await asyncio.gather(*(b.close() for b in backends), return_exceptions=True)
        if self._changed is not None:  # anything a cancelled start made after all, by label
            await in_engine_thread(self._remove_labeled)
        if self._dir is not None:
            directory, self._dir = self._dir, None
            await in_engine_thread(lambda: remove_pool_dir(directory))

    def _remove_labeled(self) -> None:
        engine = self._class(os.getcwd(), **self._options).sandbox.engine
        try:
            for container, labels in engine.labeled(POOL_LABEL):
                if labels.get(POOL_LABEL) == self.pool_id:
                    engine.remove(container)
            for volume, labels in engine.labeled_volumes(POOL_LABEL):
                if labels.get(POOL_LABEL) == self.pool_id:
                    engine.remove_volume(volume)
        except CouldNotRunError:
            pass  # the engine is gone: the janitor removes them once this process is
        finally:
            engine.close()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def warm(self) -> int:
        """How many sandboxes are ready to hand out now."""
        return len(self._ready)

    @property
    def starting(self) -> int:
        """Sandboxes being started now."""
        return self._warming

    @property
    def warm_containers(self) -> list[str]:
        """The engine's ids of the sandboxes ready to hand out now."""
        return [b.sandbox.container for b in self._ready if b.sandbox.container]

    @property
    def host_dir(self) -> str | None:
        """The pool's directory on this machine (its slots in bind mode), once started."""
        return self._dir

    # --- hand-out -----------------------------------------------------------------------
    async def backend(self, base_dir: str | os.PathLike[str]) -> ContainerBackend:
        """A warm sandbox with ``base_dir`` as its workspace: an open backend for one session
        (``Toolkit(backend)``); closing it destroys the sandbox."""
        workspace = os.path.abspath(os.path.expanduser(os.fspath(base_dir)))
        check_pool_base_dir(workspace)  # a pool's base dir is the host's workspace
        backend = await self._take()
        try:
            await backend.sandbox.adopt(workspace)
            if self._slots:
                await self._check_mounted(backend)
        except BaseException:
            await asyncio.shield(backend.close())
            raise
        self._handed = [b for b in self._handed if not b.closed]
        self._handed.append(backend)
        return backend

    async def _check_mounted(self, backend: ContainerBackend) -> None:
        """The container must see the base dir, not the empty slot: fail closed otherwise."""
        marker = slot_marker(os.path.basename(self._slot_of(backend)))
        found = await backend.stat(PathRef(base="/", path=f"{WORKSPACE}/{marker}", confine=False))
        if found.kind != "missing":
            raise CouldNotRunError(
                f"the base dir mounted onto the pool's slot did not reach the {self.engine_name} "
                "container (its engine runs in another mount namespace); use "
                "workspace_mode='copy' for this pool", retryable=False)

    @staticmethod
    def _slot_of(backend: ContainerBackend) -> str:
        mode = backend.sandbox.mode
        slot = mode.slot if isinstance(mode, BindMode) else None
        return slot or backend.sandbox.workspace

    async def _take(self) -> ContainerBackend:
        await self.start()
        assert self._changed is not None
        self._failure = None  # a new request tries again after a failure
        failures = self._failures
        self._waiting += 1
        try:
            async with self._changed:
                while True:
                    if self._closed:
                        raise HostError("the sandbox pool was closed")
                    while self._ready:
                        backend = self._ready.popleft()
                        channel = backend.sandbox.channel
                        if channel is not None and channel.alive:
                            self.handed_count += 1
                            return backend
                        self._spawn(backend.close())  # died while warm: never handed out
                    if self._failures > failures and self._failure is not None:
                        raise CouldNotRunError(f"the pool could not start a {self.engine_name} "
                                               f"sandbox: {self._failure.reason}",
                                               retryable=self._failure.retryable)
                    self._top_up()  # none ready: make sure one is starting for this request
                    await self._changed.wait()
        finally:
            self._waiting -= 1
            if self.refill:
                self._top_up()  # the replacement starts in the background

    # --- refill -------------------------------------------------------------------------
    def _top_up(self) -> None:
        """Start sandboxes until the ready and the starting ones cover the size and the
        hand-outs waiting (each hand-out starts its replacement)."""
        if self._closed or self._failure is not None:
            return  # after a failure the pool waits for the next request to try again
        if self.refill:  # the size, plus one ahead for each hand-out waiting
            wanted = self.size + self._waiting
        else:  # the first fill (less what was handed out meanwhile), then only who waits
            first_fill = 0 if self._filled_once else max(0, self.size - self.handed_count)
            wanted = max(first_fill, self._waiting)
        for _ in range(wanted - len(self._ready) - self._warming):
            self._warming += 1
            self._spawn(self._warm_one())

    def _spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm_one(self) -> None:
        assert self._limit is not None and self._changed is not None and self._dir is not None
        try:
            async with self._limit:
                if self._failure is not None:
                    return  # one failed meanwhile: the next hand-out tries again, not this queue
                backend = self._make()
                try:
                    await backend.open()
                except asyncio.CancelledError:
                    await asyncio.shield(backend.close())
                    raise
                except Exception as exc:  # noqa: BLE001 - any start failure is the pool's news
                    await asyncio.shield(backend.close())
                    self._failure = exc if isinstance(exc, CouldNotRunError) else \
                        CouldNotRunError(f"{type(exc).__name__}: {exc}", retryable=False)
                    self._failures += 1
                    return
                if self._closed:
                    await asyncio.shield(backend.close())
                    return
                self._ready.append(backend)
                self.started_count += 1
                self._filled_once = self._filled_once or len(self._ready) >= self.size
        finally:
            self._warming -= 1
            async with self._changed:
                self._changed.notify_all()

    def _make(self) -> ContainerBackend:
        assert self._dir is not None
        name = uuid.uuid4().hex[:12]
        workspace = make_slot(self._dir, name) if self._slots else self._dir
        return self._class(workspace, **self._options,
                           provisioning=Pooled(self.pool_id, self._mounts))

