"""The docker backend, through the docker SDK. Same sandbox, same agent, another ``Engine``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import IO, Any

from .._extras import install_hint
from ..seam.errors import BackendUnavailable

try:  # the engine SDK is an extra: say what to install, not a bare ModuleNotFoundError
    import docker
    import requests
    from docker.errors import APIError, DockerException, ImageNotFound, NotFound
    from docker.models.containers import _create_container_args
    from docker.tls import TLSConfig
    from docker.types import LogConfig, Mount, Ulimit
except ModuleNotFoundError as exc:
    raise BackendUnavailable(f"the docker backend needs the {exc.name!r} package: "
                             f"{install_hint('docker')}") from None

from ..policy.limits import SandboxLimits
from ..seam.errors import CouldNotRunError
from ._attach import EngineAddress, TlsFiles
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

_NOT_FOUND = (ImageNotFound, NotFound)


class DockerEngine:
    def __init__(self, endpoint: str, tls: TlsFiles | None = None) -> None:
        """``tls``: client certificate, key and CA as docker's own client takes them
        (``TlsFiles.from_env()`` reads ``DOCKER_CERT_PATH``/``DOCKER_TLS_VERIFY``)."""
        self.endpoint = endpoint
        self.tls = tls
        self._tunnel: SshTunnel | None = None
        if endpoint.startswith("ssh://"):
            self._tunnel = SshTunnel(endpoint, "/var/run/docker.sock")
            self.address = EngineAddress.tunnelled(endpoint, self._tunnel.local_socket)
        else:
            self.address = EngineAddress.parse(endpoint, tls.context() if tls else None)
        self._client: docker.DockerClient | None = None

    def _do(self, call: Any) -> Any:
        try:
            if self._client is None:  # the constructor itself talks to the engine
                self._client = self._connect()
            return transient_retry(call)
        except (DockerException, requests.exceptions.RequestException, OSError) as exc:
            raise map_engine_error("docker", self.endpoint, exc, _NOT_FOUND, APIError) from None

    def _connect(self) -> docker.DockerClient:
        if self._tunnel is not None:
            return docker.DockerClient(base_url=f"unix://{self._tunnel.up()}", timeout=30)
        if self.tls is None:
            return docker.DockerClient(base_url=self.endpoint, timeout=30)
        tls = TLSConfig(client_cert=self.tls.client_cert, ca_cert=self.tls.ca,
                        verify=self.tls.verify)
        # requests lets REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE replace a session's own CA
        # (psf/requests#3829), and the SDK asks the engine's API version inside its
        # constructor: ask it here with the environment ignored, then do the same for the SDK.
        with requests.Session() as probe:
            probe.trust_env = False
            tls.configure_client(probe)
            url = self.endpoint.replace("tcp://", "https://", 1)
            version = probe.get(f"{url}/version", timeout=30).json()["ApiVersion"]
        client = docker.DockerClient(base_url=self.endpoint, timeout=30, tls=tls, version=version)
        client.api.trust_env = False
        return client

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

    def create(self, spec: ContainerSpec) -> str:
        h: Hardening = spec.hardening
        mounts = [Mount(target=dst, source=src, type="bind", read_only=ro)
                  for src, dst, ro in spec.binds]
        # no_copy: an empty volume must stay empty, whatever the image has at that path
        mounts += [Mount(target=dst, source=name, type="volume", read_only=ro, no_copy=True)
                   for name, dst, ro in spec.volumes]
        options: dict[str, Any] = {
            "name": spec.name, "labels": spec.labels, "environment": spec.environment,
            "working_dir": "/workspace", "network_mode": h.network, "read_only": h.read_only_root,
            "tmpfs": {"/tmp": f"rw,size={h.tmpfs_size},mode=1777"}, "init": h.init,
            "mounts": mounts, "pids_limit": h.pids_limit, "mem_limit": h.memory,
            "ulimits": [Ulimit(name="nofile", soft=h.nofile, hard=h.nofile),
                        Ulimit(name="nproc", soft=h.nproc, hard=h.nproc)],
        }
        if spec.stdin_open:
            # the channel is the container's stdout: the engine must not keep a log of it
            options.update(stdin_open=True, log_config=LogConfig(type=LogConfig.types.NONE))
        if h.cpus is not None:
            options["nano_cpus"] = int(h.cpus * 1e9)
        if h.drop_all_capabilities:
            options["cap_drop"] = ["ALL"]
        if h.no_new_privileges:
            options["security_opt"] = ["no-new-privileges"]
        return str(self._do(lambda: self._create(spec, options)))

    def _create(self, spec: ContainerSpec, options: dict[str, Any]) -> str:
        # The SDK turns stdin_open into StdinOnce, and then the engine closes the agent's stdin
        # when the first attach stream ends — a dropped connection would end the session. The
        # same request, built by the SDK, with StdinOnce off:
        args = _create_container_args({"image": spec.image, "command": spec.command,
                                       "version": self.client.api._version, **options})
        name = args.pop("name")
        config = self.client.api.create_container_config(**args)
        config["StdinOnce"] = False
        return str(self.client.api.create_container_from_config(config, name)["Id"])

    def start(self, container: str) -> None:
        try:
            self._do(lambda: self.client.api.start(container))
        except CouldNotRunError:
            self.remove(container)
            raise

    def attach_path(self, container: str) -> str:
        return (f"/v{self.client.api.api_version}/containers/{container}/attach"
                "?stream=1&stdin=1&stdout=1&stderr=1")

    def put_archive(self, container: str, path: str, data: IO[bytes]) -> None:
        def put() -> None:
            data.seek(0)
            self.client.api.put_archive(container, path, data)
        self._do(put)

    @contextlib.contextmanager
    def get_archive(self, container: str, path: str) -> Iterator[Iterator[bytes]]:
        # the SDK's get_archive leaves its response open when the caller stops early
        api = self.client.api
        response = self._do(lambda: api.get(api._url("/containers/{0}/archive", container),
                                            params={"path": path}, stream=True))
        try:
            self._do(lambda: api._raise_for_status(response))
            yield response.iter_content(1 << 20)
        finally:
            response.close()

    def path_stat(self, container: str, path: str) -> dict[str, Any] | None:
        """What is at ``path`` in the container, its last component not followed; None when
        nothing is."""
        api = self.client.api
        response = self._do(lambda: api.head(api._url("/containers/{0}/archive", container),
                                             params={"path": path}))
        if response.status_code == 404:
            return None
        self._do(lambda: api._raise_for_status(response))
        return decode_path_stat(response.headers.get("X-Docker-Container-Path-Stat"))

    def volume_exists(self, name: str) -> bool:
        try:
            self._do(lambda: self.client.api.inspect_volume(name))
        except CouldNotRunError as exc:
            if "not found" in exc.reason.lower() or "no such" in exc.reason.lower():
                return False
            raise
        return True

    def create_volume(self, name: str, labels: dict[str, str]) -> None:
        self._do(lambda: self.client.api.create_volume(name, labels=labels))

    def remove_volume(self, name: str) -> None:
        try:
            self._do(lambda: self.client.api.remove_volume(name, force=True))
        except CouldNotRunError as exc:
            if "not found" not in exc.reason.lower() and "no such" not in exc.reason.lower():
                raise

    def arch(self) -> str:
        return str(self._do(lambda: self.client.api.info())["Architecture"])

    def labeled_volumes(self, label: str) -> list[tuple[str, dict[str, str]]]:
        found = self._do(lambda: self.client.api.volumes(filters={"label": label}))
        return [(str(v["Name"]), dict(v.get("Labels") or {})) for v in found.get("Volumes") or []]

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
            self._client = None
        if self._tunnel is not None:
            self._tunnel.close()


def docker_engine(endpoint: str | None = None, tls: TlsFiles | None = None) -> DockerEngine:
    """The engine at ``endpoint``, else ``TOOLSEAM_DOCKER_URL``, ``DOCKER_HOST``, the local
    socket; TLS from docker's own variables for a TCP endpoint given none."""
    url = (endpoint or os.environ.get("TOOLSEAM_DOCKER_URL") or os.environ.get("DOCKER_HOST")
           or "unix:///var/run/docker.sock")
    if tls is None and url.startswith(("tcp://", "https://")):
        tls = TlsFiles.from_env()
    return DockerEngine(url, tls)


class DockerBackend(ContainerBackend):
    """``DockerBackend(workspace, image=..., endpoint=...)``."""

    def __init__(self, workspace: str = ".", *, image: str = DEFAULT_IMAGE,
                 endpoint: str | None = None, hardening: Hardening | None = None,
                 limits: SandboxLimits | None = None, pull: PullPolicy = "missing",
                 auth: dict[str, str] | None = None,
                 on_pull_progress: PullCallback | None = None,
                 workspace_mode: WorkspaceMode = "auto", tls: TlsFiles | None = None,
                 copy_limit: int | None = None,
                 agent_bundles: Mapping[str, str] | None = None,
                 copy_keep_group_write: bool = False) -> None:
        """``endpoint``: ``unix://…``, ``tcp://host:port`` (with ``tls``, or docker's own
        ``DOCKER_TLS_VERIFY``/``DOCKER_CERT_PATH``), ``https://`` or
        ``ssh://[user@]host[:port][/path/to/docker.sock]`` (through the system's ssh); default
        ``TOOLSEAM_DOCKER_URL``, then ``DOCKER_HOST``, then the local socket.
        ``copy_keep_group_write``: copy mode brings group/other write bits home (by default
        they are dropped; set-id and sticky bits never come)."""
        super().__init__(docker_engine(endpoint, tls), "docker", image, os.path.abspath(workspace),
                         hardening, limits, pull, auth, on_pull_progress, workspace_mode,
                         copy_limit, agent_bundles, copy_keep_group_write)


__all__ = ["DockerBackend", "DockerEngine", "Hardening"]
