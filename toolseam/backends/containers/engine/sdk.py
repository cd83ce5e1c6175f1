"""``SdkEngine``: the ONE engine implementation, over a ``Dialect`` per SDK.

Everything engines share lives here: the lazy client (an ssh endpoint's tunnel comes up at first
use), bounded retries of transient failures (``retry``), the one error map (``errors``), the
archive API (the same REST calls on docker and podman), what a missing container or volume
means, the state of a container as the sandbox reads it. A dialect says only what its SDK spells
differently: how to make a client, create a container, pull, list, inspect and remove.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import IO, Any, Protocol, TypeVar

from .attach import EngineAddress, TlsFiles
from .errors import EngineError, EngineNotFound, EngineUnreachable, SdkErrors, map_engine_error
from .protocol import ContainerSpec, ContainerState, decode_path_stat
from .pull import PullCallback, follow_pull, split_reference
from .retry import transient_retry
from .ssh import SshTunnel

T = TypeVar("T")


class Dialect(Protocol):
    """What one engine SDK spells its own way. ``client`` is the SDK's client object."""

    name: str  # the engine's name in messages ("docker", "podman")
    errors: SdkErrors
    engine_socket: str  # the engine's socket on an ssh host, when the URL names none
    # what the archive API makes of a time below the second ("truncate": moby's archive,
    # "round": Go's tar writer, as podman's leaves it): the sandbox's own pack does the same
    archive_mtime: str

    def connect(self, url: str, tls: TlsFiles | None) -> Any: ...
    def ping(self, client: Any) -> bool: ...
    def pull_events(self, client: Any, repository: str, tag: str, auth: dict[str, str] | None
                    ) -> Iterator[dict[str, Any]]: ...
    def inspect_image(self, client: Any, image: str) -> None: ...
    def create(self, client: Any, spec: ContainerSpec) -> str: ...
    def start(self, client: Any, container: str) -> None: ...
    def attach_path(self, client: Any, container: str) -> str: ...
    def request(self, client: Any, method: str, path: str, **kwargs: Any) -> Any: ...
    def changes(self, client: Any, container: str) -> list[dict[str, Any]]: ...
    def inspect_volume(self, client: Any, name: str) -> None: ...
    def create_volume(self, client: Any, name: str, labels: dict[str, str],
                      options: dict[str, str] | None = None) -> None: ...
    def remove_volume(self, client: Any, name: str) -> None: ...
    def volumes(self, client: Any, label: str) -> list[tuple[str, dict[str, str]]]: ...
    def arch(self, client: Any) -> str: ...
    def inspect_container(self, client: Any, container: str) -> dict[str, Any]: ...
    def logs(self, client: Any, container: str) -> bytes: ...
    def remove_container(self, client: Any, container: str) -> None: ...
    def containers(self, client: Any, label: str) -> list[tuple[str, dict[str, str]]]: ...
    def commit(self, client: Any, container: str, change: str) -> str: ...
    def remove_image(self, client: Any, image: str) -> None: ...
    def images(self, client: Any, label: str) -> list[tuple[str, dict[str, str]]]: ...
    def close(self, client: Any) -> None: ...


# what a LABEL instruction takes unquoted (an owner label: host:pid:start-time)
_LABEL_PART = re.compile(r"[A-Za-z0-9_.:-]+")


class SdkEngine:
    """One engine endpoint, through its SDK (synchronous; the sandbox runs calls in threads)."""

    def __init__(self, dialect: Dialect, endpoint: str, tls: TlsFiles | None = None) -> None:
        self.dialect = dialect
        self.endpoint = endpoint
        self.tls = tls
        self.tunnel: SshTunnel | None = None
        if endpoint.startswith("ssh://"):
            self.tunnel = SshTunnel(endpoint, dialect.engine_socket)
            self.address = EngineAddress.tunnelled(endpoint, self.tunnel.local_socket)
        else:
            self.address = EngineAddress.parse(endpoint, tls.context() if tls else None)
        self._client: Any = None

    @property
    def archive_mtime(self) -> str:
        return self.dialect.archive_mtime

    @property
    def connected(self) -> bool:
        """Whether an SDK client is open (none is after ``close``)."""
        return self._client is not None

    @property
    def client(self) -> Any:
        """The SDK's client, made at first use (the SDK's constructor talks to the engine)."""
        if self._client is None:
            url = f"unix://{self.tunnel.up()}" if self.tunnel is not None else self.endpoint
            try:
                self._client = self.dialect.connect(url, None if self.tunnel else self.tls)
            except self.dialect.errors.caught as exc:
                raise map_engine_error(self.dialect.name, self.endpoint, exc, self.dialect.errors,
                                       connecting=True) from None
        return self._client

    def _do(self, call: Callable[[Any], T]) -> T:
        client = self.client
        try:
            return transient_retry(lambda: call(client))
        except self.dialect.errors.caught as exc:
            raise map_engine_error(self.dialect.name, self.endpoint, exc,
                                   self.dialect.errors) from None

    # --- the engine, images, containers ---------------------------------------------------
    def ping(self) -> None:
        if not self._do(self.dialect.ping):
            raise EngineUnreachable(f"{self.dialect.name} engine unreachable at {self.endpoint}")

    def arch(self) -> str:
        return self._do(self.dialect.arch)

    def pull(self, image: str, auth: dict[str, str] | None, on_progress: PullCallback | None
             ) -> None:
        """Pull through the engine API, reporting progress; a failure names image and registry.
        Not retried here, and its failures have their own kinds (``pull``)."""
        repository, tag = split_reference(image)
        client = self.client
        follow_pull(self.dialect.name, self.endpoint, image,
                    lambda: self.dialect.pull_events(client, repository, tag, auth),
                    self.dialect.errors.base, on_progress)

    def image_exists(self, image: str) -> bool:
        try:
            self._do(lambda c: self.dialect.inspect_image(c, image))
        except EngineNotFound:
            return False
        return True

    def create(self, spec: ContainerSpec) -> str:
        return self._do(lambda c: self.dialect.create(c, spec))

    def start(self, container: str) -> None:
        try:
            self._do(lambda c: self.dialect.start(c, container))
        except EngineError:
            self.remove(container)
            raise

    def attach_path(self, container: str) -> str:
        return self.dialect.attach_path(self.client, container)

    def state(self, container: str) -> ContainerState:
        state = self._do(lambda c: self.dialect.inspect_container(c, container)).get("State", {})
        return ContainerState(running=bool(state.get("Running")), exit_code=state.get("ExitCode"),
                              oom_killed=bool(state.get("OOMKilled")),
                              status=str(state.get("Status", "")), error=str(state.get("Error", "")))

    def host_config(self, container: str) -> dict[str, Any]:
        return dict(self._do(lambda c: self.dialect.inspect_container(c, container))["HostConfig"])

    def stats(self, container: str) -> dict[str, Any]:
        """One sample of the container's cgroup statistics (the compatible REST call, the same
        on docker and podman; ``one-shot``: no second sample waited for)."""
        def sample(client: Any) -> dict[str, Any]:
            answer = self.dialect.request(client, "GET", f"/containers/{container}/stats",
                                          params={"stream": False, "one-shot": True})
            answer.raise_for_status()
            return dict(answer.json())

        return self._do(sample)

    def logs(self, container: str) -> str:
        return self._do(lambda c: self.dialect.logs(c, container)).decode("utf-8", "replace")

    def remove(self, container: str) -> None:
        """Remove a container and its anonymous volumes; one already gone is no failure."""
        with contextlib.suppress(EngineNotFound):
            self._do(lambda c: self.dialect.remove_container(c, container))

    def labeled(self, label: str) -> list[tuple[str, dict[str, str]]]:
        return self._do(lambda c: self.dialect.containers(c, label))

    # --- a fork's start image (fork_image.py) ---------------------------------------------
    def commit(self, container: str, label: tuple[str, str]) -> str:
        """An image of the container's files (never paused: it is one that never ran),
        labelled ``label`` (key, value); its id."""
        key, value = label
        if not (_LABEL_PART.fullmatch(key) and _LABEL_PART.fullmatch(value)):
            raise ValueError(f"label {key}={value} cannot be written as a LABEL instruction")
        return self._do(lambda c: self.dialect.commit(c, container, f"LABEL {key}={value}"))

    def remove_image(self, image: str) -> None:
        """Remove an image no container uses (never forced: podman's force would remove the
        containers that use it); one already gone is no failure."""
        with contextlib.suppress(EngineNotFound):
            self._do(lambda c: self.dialect.remove_image(c, image))

    def labeled_images(self, label: str) -> list[tuple[str, dict[str, str]]]:
        return self._do(lambda c: self.dialect.images(c, label))

    # --- the archive API: the same REST calls on every engine ----------------------------
    def put_archive(self, container: str, path: str, data: IO[bytes]) -> None:
        def put(client: Any) -> None:
            data.seek(0)
            self.dialect.request(client, "PUT", f"/containers/{container}/archive",
                                 params={"path": path}, data=data).raise_for_status()
        self._do(put)

    @contextlib.contextmanager
    def get_archive(self, container: str, path: str) -> Iterator[Iterator[bytes]]:
        # read and closed here: an SDK's own get_archive leaves its response open when the
        # caller stops early
        response = self._do(lambda c: self.dialect.request(
            c, "GET", f"/containers/{container}/archive", params={"path": path}, stream=True))
        try:
            self._do(lambda _: response.raise_for_status())
            yield response.iter_content(1 << 20)
        finally:
            response.close()

    def path_stat(self, container: str, path: str) -> dict[str, Any] | None:
        """What is at ``path`` in the container, its last component not followed (its
        ``mode`` says a symlink even where podman's ``linkTarget`` is the resolved path); None
        when nothing is."""
        response = self._do(lambda c: self.dialect.request(
            c, "HEAD", f"/containers/{container}/archive", params={"path": path}))
        if response.status_code == 404:
            return None
        self._do(lambda _: response.raise_for_status())
        return decode_path_stat(response.headers.get("X-Docker-Container-Path-Stat"))

    # --- the container's writable layer (containers/layer.py) -------------------------------
    def changes(self, container: str) -> list[tuple[str, int]]:
        """What the container's writable layer changed, as the engine's diff says it: (absolute
        path, kind) with kind 0 changed, 1 added, 2 deleted; mounts are not in it."""
        found = self._do(lambda c: self.dialect.changes(c, container)) or []
        return [(str(item["Path"]), int(item["Kind"])) for item in found]

    def mount_points(self, container: str) -> list[str]:
        """Where the container has something mounted (binds, volumes, tmpfs the engine lists)."""
        found = self._do(lambda c: self.dialect.inspect_container(c, container))
        points = [str(m.get("Destination", "")) for m in found.get("Mounts") or []]
        points += list((found.get("HostConfig") or {}).get("Tmpfs") or {})
        return [p for p in points if p.startswith("/")]

    # --- volumes ----------------------------------------------------------------------------
    def volume_exists(self, name: str) -> bool:
        try:
            self._do(lambda c: self.dialect.inspect_volume(c, name))
        except EngineNotFound:
            return False
        return True

    def create_volume(self, name: str, labels: dict[str, str],
                      options: dict[str, str] | None = None) -> None:
        """A volume of the engine's ``local`` driver; ``options`` its mount (``type``,
        ``device``, ``o``: a fork's overlay, ``fork_overlay.py``), mounted by the engine when a
        container using it starts and unmounted when it stops."""
        self._do(lambda c: self.dialect.create_volume(c, name, labels, options))

    def remove_volume(self, name: str) -> None:
        """Remove a volume; one already gone is no failure."""
        with contextlib.suppress(EngineNotFound):
            self._do(lambda c: self.dialect.remove_volume(c, name))

    def labeled_volumes(self, label: str) -> list[tuple[str, dict[str, str]]]:
        return self._do(lambda c: self.dialect.volumes(c, label))

    def close(self) -> None:
        if self._client is not None:
            self.dialect.close(self._client)
            self._client = None
        if self.tunnel is not None:
            self.tunnel.close()
