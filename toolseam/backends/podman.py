"""The podman backend, rootful or rootless, through podman-py and the podman API service.

Rootless is the same code with another endpoint: the API service of the unprivileged user
(``unix:///run/user/UID/podman/podman.sock``). Container root maps to that user, so files the
sandbox creates in the workspace belong to the user and stay editable and removable by them.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from typing import IO, Any

from .._extras import install_hint
from ..seam.errors import BackendUnavailable

try:  # the engine SDK is an extra: say what to install, not a bare ModuleNotFoundError
    import requests
    from podman import PodmanClient
    from podman.api import encode_auth_header
    from podman.errors import APIError, ImageNotFound, NotFound, PodmanError
except ModuleNotFoundError as exc:
    raise BackendUnavailable(f"the podman backend needs the {exc.name!r} package: "
                             f"{install_hint('podman')}") from None

from ..policy.limits import SandboxLimits
from ..seam.errors import CouldNotRunError
from ._attach import EngineAddress
from ._container_backend import DEFAULT_IMAGE, ContainerBackend
from ._container_sandbox import (
    ContainerSpec,
    ContainerState,
    Hardening,
    WorkspaceMode,
    decode_path_stat,
    map_engine_error,
)
from ._pull import PullCallback, PullPolicy, follow_pull, split_reference
from ._retry import transient_retry
from ._ssh import SshTunnel


def default_endpoint(rootless: bool) -> str:
    if rootless or os.geteuid() != 0:
        runtime = os.environ.get("XDG_RUNTIME_DIR", f"/run/user/{os.geteuid()}")
        return f"unix://{runtime}/podman/podman.sock"
    return "unix:///run/podman/podman.sock"


_NOT_FOUND = (ImageNotFound, NotFound)


class PodmanEngine:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._tunnel: SshTunnel | None = None
        if endpoint.startswith("ssh://"):
            self._tunnel = SshTunnel(endpoint, "/run/podman/podman.sock")
            self.address = EngineAddress.tunnelled(endpoint, self._tunnel.local_socket)
        else:
            self.address = EngineAddress.parse(endpoint)
        self._sdk: PodmanClient | None = None

    @property
    def _client(self) -> PodmanClient:
        """Made at first use: an ssh endpoint's tunnel comes up then, not at construction."""
        if self._sdk is None:
            url = f"unix://{self._tunnel.up()}" if self._tunnel is not None else self.endpoint
            self._sdk = PodmanClient(base_url=url, timeout=30)
        return self._sdk

    def _do(self, call: Any) -> Any:
        try:
            return transient_retry(call)
        except (PodmanError, requests.exceptions.RequestException, OSError) as exc:
            raise map_engine_error("podman", self.endpoint, exc, _NOT_FOUND, APIError) from None

    def ping(self) -> None:
        if not self._do(lambda: self._client.ping()):
            raise CouldNotRunError(f"podman engine unreachable at {self.endpoint}", retryable=True)

    def pull(self, image: str, auth: dict[str, str] | None, on_progress: PullCallback | None
             ) -> None:
        """Pull through the engine API, reporting progress; a failure names image and registry."""
        repository, tag = split_reference(image)
        follow_pull("podman", self.endpoint, image,
                    lambda: self._pull_events(repository, tag, auth), (PodmanError,), on_progress)

    def _pull_events(self, repository: str, tag: str, auth: dict[str, str] | None) -> Any:
        """The libpod pull stream, read line by line and closed after (podman-py's own
        streaming pull leaves its response open when the caller stops early)."""
        token = encode_auth_header(auth) if auth else ""
        headers = {"X-Registry-Auth": token.decode() if isinstance(token, bytes) else token}
        params = {"reference": f"{repository}:{tag}" if not tag.startswith("sha256:")
                  else f"{repository}@{tag}", "policy": "always", "compatMode": True}
        response = self._client.api.post("/images/pull", params=params, stream=True,
                                         headers=headers)
        try:
            response.raise_for_status(not_found=ImageNotFound)
            for line in response.iter_lines():
                if line:
                    yield json.loads(line)
        finally:
            response.close()

    def image_exists(self, image: str) -> bool:
        return bool(self._do(lambda: self._client.images.exists(image)))

    def create(self, spec: ContainerSpec) -> str:
        h: Hardening = spec.hardening
        mounts = [{"type": "bind", "source": src, "target": dst, "read_only": ro}
                  for src, dst, ro in spec.binds]
        mounts.append({"type": "tmpfs", "source": "tmpfs", "target": "/tmp",
                       "size": h.tmpfs_size, "mode": "1777"})
        # nocopy: an empty volume must stay empty, whatever the image has at that path
        volumes = {name: {"bind": dst, "mode": "ro" if ro else "rw", "extended_mode": ["nocopy"]}
                   for name, dst, ro in spec.volumes}
        options: dict[str, Any] = {
            "name": spec.name, "labels": spec.labels, "environment": spec.environment,
            "working_dir": "/workspace", "network_mode": h.network, "read_only": h.read_only_root,
            "read_write_tmpfs": False, "mounts": mounts, "volumes": volumes, "init": h.init,
            "runtime": "runc", "pids_limit": h.pids_limit, "mem_limit": h.memory,
            "ulimits": [{"Name": "nofile", "Soft": h.nofile, "Hard": h.nofile},
                        {"Name": "nproc", "Soft": h.nproc, "Hard": h.nproc}],
        }
        if spec.stdin_open:
            # the channel is the container's stdout: the engine must not keep a log of it
            options.update(stdin_open=True, log_config={"Type": "none"})
        if h.cpus is not None:  # podman-py refuses nano_cpus: the same as a quota per period
            options["cpu_period"] = 100_000
            options["cpu_quota"] = int(h.cpus * 100_000)
        if h.drop_all_capabilities:
            options["cap_drop"] = ["all"]
        if h.no_new_privileges:
            options["no_new_privileges"] = True
        return str(self._do(lambda: self._client.containers.create(
            spec.image, spec.command, **options).id))

    def start(self, container: str) -> None:
        def start() -> None:
            self._client.api.post(f"/containers/{container}/start").raise_for_status()
        try:
            self._do(start)
        except CouldNotRunError:
            self.remove(container)
            raise

    def attach_path(self, container: str) -> str:
        return (f"/v4.0.0/libpod/containers/{container}/attach"
                "?stream=true&stdin=true&stdout=true&stderr=true")

    def put_archive(self, container: str, path: str, data: IO[bytes]) -> None:
        def put() -> None:
            data.seek(0)
            response = self._client.api.put(f"/containers/{container}/archive",
                                            params={"path": path}, data=data)
            response.raise_for_status()
        self._do(put)

    @contextlib.contextmanager
    def get_archive(self, container: str, path: str) -> Iterator[Iterator[bytes]]:
        response = self._do(lambda: self._client.api.get(
            f"/containers/{container}/archive", params={"path": path}, stream=True))
        try:
            self._do(response.raise_for_status)
            yield response.iter_content(1 << 20)
        finally:
            response.close()

    def path_stat(self, container: str, path: str) -> dict[str, Any] | None:
        """What is at ``path`` in the container (its ``mode`` says a symlink even where
        podman's ``linkTarget`` is the resolved path); None when nothing is."""
        response = self._do(lambda: self._client.api.head(f"/containers/{container}/archive",
                                                          params={"path": path}))
        if response.status_code == 404:
            return None
        self._do(response.raise_for_status)
        return decode_path_stat(response.headers.get("X-Docker-Container-Path-Stat"))

    def volume_exists(self, name: str) -> bool:
        return bool(self._do(lambda: self._client.volumes.exists(name)))

    def create_volume(self, name: str, labels: dict[str, str]) -> None:
        self._do(lambda: self._client.volumes.create(name, labels=labels))

    def remove_volume(self, name: str) -> None:
        try:
            self._do(lambda: self._client.volumes.remove(name, force=True))
        except CouldNotRunError as exc:
            if "not found" not in exc.reason.lower() and "no such" not in exc.reason.lower():
                raise

    def arch(self) -> str:
        info = self._do(lambda: self._client.info())  # type: ignore[no-untyped-call]
        return str(info["host"]["arch"])

    def labeled_volumes(self, label: str) -> list[tuple[str, dict[str, str]]]:
        found = self._do(lambda: self._client.volumes.list(filters={"label": label}))
        return [(str(v.name), dict(v.attrs.get("Labels") or {})) for v in found]

    def state(self, container: str) -> ContainerState:
        attrs = self._do(lambda: self._client.containers.get(container).attrs)
        state = attrs.get("State", {})
        return ContainerState(running=bool(state.get("Running")), exit_code=state.get("ExitCode"),
                              oom_killed=bool(state.get("OOMKilled")),
                              status=str(state.get("Status", "")), error=str(state.get("Error", "")))

    def host_config(self, container: str) -> dict[str, Any]:
        return dict(self._do(lambda: self._client.containers.get(container).attrs)["HostConfig"])

    def logs(self, container: str) -> str:
        chunks = self._do(lambda: list(self._client.containers.get(container).logs(tail=20)))
        return b"".join(c if isinstance(c, bytes) else str(c).encode() for c in chunks).decode(
            "utf-8", "replace")

    def remove(self, container: str) -> None:
        try:
            self._do(lambda: self._client.containers.get(container).remove(force=True, v=True))
        except CouldNotRunError as exc:
            if "not found" not in exc.reason.lower() and "no such" not in exc.reason.lower():
                raise

    def labeled(self, label: str) -> list[tuple[str, dict[str, str]]]:
        found = self._do(lambda: self._client.containers.list(all=True, filters={"label": label}))
        return [(str(c.id), dict(c.labels or {})) for c in found]

    def close(self) -> None:
        if self._sdk is not None:
            self._sdk.close()  # type: ignore[no-untyped-call]
            self._sdk = None
        if self._tunnel is not None:
            self._tunnel.close()


def podman_engine(endpoint: str | None = None, rootless: bool = False) -> PodmanEngine:
    """The engine at ``endpoint``, else ``TOOLSEAM_PODMAN_URL`` (``…_ROOTLESS_URL``), else
    the default socket."""
    variable = "TOOLSEAM_PODMAN_ROOTLESS_URL" if rootless else "TOOLSEAM_PODMAN_URL"
    return PodmanEngine(endpoint or os.environ.get(variable) or default_endpoint(rootless))


class PodmanBackend(ContainerBackend):
    """``PodmanBackend(workspace, image=..., endpoint=..., rootless=...)``."""

    def __init__(self, workspace: str = ".", *, image: str = DEFAULT_IMAGE,
                 endpoint: str | None = None, rootless: bool = False,
                 hardening: Hardening | None = None, limits: SandboxLimits | None = None,
                 pull: PullPolicy = "missing", auth: dict[str, str] | None = None,
                 on_pull_progress: PullCallback | None = None,
                 workspace_mode: WorkspaceMode = "auto", copy_limit: int | None = None,
                 agent_bundles: Mapping[str, str] | None = None,
                 copy_keep_group_write: bool = False) -> None:
        """``endpoint``: ``unix://…``, ``tcp://host:port`` (podman's API service) or
        ``ssh://[user@]host[:port][/path/to/podman.sock]`` (default ``/run/podman/podman.sock``).
        ``copy_keep_group_write``: copy mode brings group/other write bits home (by default
        they are dropped; set-id and sticky bits never come)."""
        super().__init__(podman_engine(endpoint, rootless),
                         "podman-rootless" if rootless else "podman", image,
                         os.path.abspath(workspace), hardening, limits, pull, auth,
                         on_pull_progress, workspace_mode, copy_limit, agent_bundles,
                         copy_keep_group_write)


__all__ = ["Hardening", "PodmanBackend", "PodmanEngine"]
