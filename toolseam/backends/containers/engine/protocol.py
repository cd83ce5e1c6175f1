"""What the sandbox asks of an engine: the ``Engine`` protocol (``sdk.SdkEngine`` implements it
once, over a dialect per SDK), the container it is asked to make (``ContainerSpec`` with its
``Hardening``), what it reports (``ContainerState``, the archive API's path stat), and the
threads its blocking calls run in."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Protocol, TypeVar

from ....policy.limits import SandboxLimits
from .attach import EngineAddress

if TYPE_CHECKING:  # pull.py needs requests (an extra): the CLI imports this module without it
    from .pull import PullCallback

T = TypeVar("T")
# Engine calls block (the SDKs are synchronous): they run in threads of their own. asyncio's
# default executor has min(32, CPUs + 4) threads — 6 on a 2-CPU machine — and 16 sessions
# opening at once queued behind it (docs/pool.md, decision 113); an idle thread costs nothing.
_ENGINE_THREADS = concurrent.futures.ThreadPoolExecutor(max_workers=64,
                                                        thread_name_prefix="toolseam-engine")

async def in_engine_thread(func: Callable[[], T]) -> T:
    """Run a blocking engine call in the engine threads."""
    return await asyncio.get_running_loop().run_in_executor(_ENGINE_THREADS, func)


@dataclass(frozen=True)
class Hardening:
    """The sandbox's defaults (CONTRACT §9); every one can be overridden by the host. What it
    may use (memory, CPUs, processes, network, /tmp) is the one limits type, ``SandboxLimits``:
    written once, here and in settings alike."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    read_only_root: bool = True
    drop_all_capabilities: bool = True
    no_new_privileges: bool = True
    nofile: int = 1024  # below the hard limit: the engine cannot raise rlimits here
    nproc: int = 4096
    # No engine init: the agent itself is pid 1 (it reaps every orphan), because the kernel
    # spares a namespace's pid 1 from signals sent inside it — `kill -9 -1` from a command
    # would otherwise kill the agent with everything else and end the session.
    init: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    image: str
    name: str
    command: list[str]
    labels: dict[str, str]
    environment: dict[str, str]
    binds: list[tuple[str, str, bool]]  # (host path, container path, read only)
    hardening: Hardening
    volumes: list[tuple[str, str, bool]] = field(default_factory=list)  # (name, path, read only)
    stdin_open: bool = False  # the channel is the attach stream to the agent's stdin/stdout
    # container paths of binds that receive mounts the host makes below them later (slave
    # propagation): a pool's slot, onto which the base dir is mounted at hand-out
    slave_binds: tuple[str, ...] = ()
    auto_remove: bool = False  # the engine removes it when it stops (a durable session's)


@dataclass
class ContainerState:
    running: bool
    exit_code: int | None
    oom_killed: bool
    status: str
    error: str = ""


class Engine(Protocol):
    """One engine SDK behind the calls the sandbox needs (synchronous; run in threads)."""

    endpoint: str
    address: EngineAddress  # where the attach stream connects (unix, TCP, TLS)

    @property
    def archive_mtime(self) -> str:  # "truncate" or "round": its archive's times, in seconds
        ...

    def ping(self) -> None: ...
    def image_exists(self, image: str) -> bool: ...
    def pull(self, image: str, auth: dict[str, str] | None, on_progress: PullCallback | None
             ) -> None: ...
    def create(self, spec: ContainerSpec) -> str: ...
    def start(self, container: str) -> None: ...
    def attach_path(self, container: str) -> str: ...
    def put_archive(self, container: str, path: str, data: IO[bytes]) -> None: ...
    def get_archive(self, container: str, path: str) -> contextlib.AbstractContextManager[
        Iterator[bytes]]: ...
    def path_stat(self, container: str, path: str) -> dict[str, Any] | None: ...
    def changes(self, container: str) -> list[tuple[str, int]]: ...
    def mount_points(self, container: str) -> list[str]: ...
    def volume_exists(self, name: str) -> bool: ...
    def create_volume(self, name: str, labels: dict[str, str],
                      options: dict[str, str] | None = None) -> None: ...  # local driver's
    def remove_volume(self, name: str) -> None: ...
    def labeled_volumes(self, label: str) -> list[tuple[str, dict[str, str]]]: ...
    def arch(self) -> str: ...  # the engine machine's CPU, as the engine names it
    def state(self, container: str) -> ContainerState: ...
    def host_config(self, container: str) -> dict[str, Any]: ...
    def stats(self, container: str) -> dict[str, Any]: ...
    def logs(self, container: str) -> str: ...
    def remove(self, container: str) -> None: ...
    def labeled(self, label: str) -> list[tuple[str, dict[str, str]]]: ...
    # a fork's start image (fork_image.py): a never-started container's files, committed
    def commit(self, container: str, label: tuple[str, str]) -> str: ...
    def remove_image(self, image: str) -> None: ...
    def labeled_images(self, label: str) -> list[tuple[str, dict[str, str]]]: ...
    def close(self) -> None: ...


GO_MODE_SYMLINK = 1 << 27  # os.ModeSymlink in the engines' path stat (Go's FileMode)


def decode_path_stat(header: str | None) -> dict[str, Any]:
    """The archive API's ``X-Docker-Container-Path-Stat`` header (base64 JSON: name, size,
    mode as Go's FileMode, mtime, linkTarget), the same on docker and podman."""
    if not header:
        return {}
    return dict(json.loads(base64.b64decode(header)))
