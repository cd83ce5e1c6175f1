"""The docker backend, through the docker SDK. Same sandbox, same agent, another ``Engine``."""

from __future__ import annotations

import os
from typing import Any

import docker
import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from docker.types import Mount, Ulimit

from ..policy.limits import SandboxLimits
from ..seam.errors import CouldNotRunError
from ._container_backend import DEFAULT_IMAGE, ContainerBackend
from ._container_sandbox import ContainerSpec, ContainerState, Hardening, map_engine_error
from ._pull import PullCallback, PullPolicy, follow_pull, split_reference
from ._retry import transient_retry

_NOT_FOUND = (ImageNotFound, NotFound)


class DockerEngine:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._client: docker.DockerClient | None = None

    def _do(self, call: Any) -> Any:
        try:
            if self._client is None:  # the constructor itself talks to the engine
                self._client = docker.DockerClient(base_url=self.endpoint, timeout=30)
            return transient_retry(call)
        except (DockerException, requests.exceptions.RequestException, OSError) as exc:
            raise map_engine_error("docker", self.endpoint, exc, _NOT_FOUND, APIError) from None

    @property
    def client(self) -> docker.DockerClient:
        assert self._client is not None
        return self._client

    def ping(self) -> None:
        self._do(lambda: self.client.ping())

    def pull(self, image: str, auth: dict[str, str] | None, on_progress: PullCallback | None
             ) -> None:
        """Pull through the engine API, reporting progress; a failure names image and registry.
        Not through ``_do``: a pull is not retried here, and its failures have their own kinds."""
        repository, tag = split_reference(image)
        follow_pull("docker", self.endpoint, image, lambda: self.client.api.pull(
            repository, tag, stream=True, decode=True, auth_config=auth),
            (DockerException,), on_progress)

    def image_exists(self, image: str) -> bool:
        try:
            self._do(lambda: self.client.images.get(image))
        except CouldNotRunError as exc:
            if "not found" in exc.reason.lower():
                return False
            raise
        return True

    def run(self, spec: ContainerSpec) -> str:
        h: Hardening = spec.hardening
        options: dict[str, Any] = {
            "name": spec.name, "labels": spec.labels, "environment": spec.environment,
            "working_dir": "/workspace", "network_mode": h.network, "read_only": h.read_only_root,
            "tmpfs": {"/tmp": f"rw,size={h.tmpfs_size},mode=1777"}, "init": h.init,
            "mounts": [Mount(target=dst, source=src, type="bind", read_only=ro)
                       for src, dst, ro in spec.binds],
            "pids_limit": h.pids_limit, "mem_limit": h.memory, "detach": True,
            "ulimits": [Ulimit(name="nofile", soft=h.nofile, hard=h.nofile),
                        Ulimit(name="nproc", soft=h.nproc, hard=h.nproc)],
        }
        if h.cpus is not None:
            options["nano_cpus"] = int(h.cpus * 1e9)
        if h.drop_all_capabilities:
            options["cap_drop"] = ["ALL"]
        if h.no_new_privileges:
            options["security_opt"] = ["no-new-privileges"]
        container = self._do(lambda: self.client.containers.run(spec.image, spec.command, **options))
        return str(container.id)

    def state(self, container: str) -> ContainerState:
        attrs = self._do(lambda: self.client.api.inspect_container(container))
        state = attrs.get("State", {})
        return ContainerState(running=bool(state.get("Running")), exit_code=state.get("ExitCode"),
                              oom_killed=bool(state.get("OOMKilled")),
                              status=str(state.get("Status", "")), error=str(state.get("Error", "")))

    def host_config(self, container: str) -> dict[str, Any]:
        return dict(self._do(lambda: self.client.api.inspect_container(container))["HostConfig"])

    def logs(self, container: str) -> str:
        data = self._do(lambda: self.client.api.logs(container, tail=20))
        return bytes(data).decode("utf-8", "replace")

    def remove(self, container: str) -> None:
        try:
            self._do(lambda: self.client.api.remove_container(container, force=True, v=True))
        except CouldNotRunError as exc:
            if "not found" not in exc.reason.lower() and "no such" not in exc.reason.lower():
                raise

    def labeled(self, label: str) -> list[tuple[str, dict[str, str]]]:
        found = self._do(lambda: self.client.api.containers(all=True, filters={"label": label}))
        return [(str(c["Id"]), dict(c.get("Labels") or {})) for c in found]

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


class DockerBackend(ContainerBackend):
    """``DockerBackend(workspace, image=..., endpoint=...)``."""

    def __init__(self, workspace: str = ".", *, image: str = DEFAULT_IMAGE,
                 endpoint: str | None = None, hardening: Hardening | None = None,
                 limits: SandboxLimits | None = None, pull: PullPolicy = "missing",
                 auth: dict[str, str] | None = None,
                 on_pull_progress: PullCallback | None = None) -> None:
        url = endpoint or os.environ.get("TOOLSEAM_DOCKER_URL") or "unix:///var/run/docker.sock"
        super().__init__(DockerEngine(url), "docker", image, os.path.abspath(workspace), hardening,
                         limits, pull, auth, on_pull_progress)


__all__ = ["DockerBackend", "DockerEngine", "Hardening"]
