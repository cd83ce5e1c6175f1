"""What docker-py spells its own way (``engine.Dialect``). Imports the docker SDK: an extra."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import docker
import requests
from docker.errors import DockerException, ImageNotFound, NotFound
from docker.tls import TLSConfig
from docker.types import LogConfig, Mount, Ulimit

from .attach import TlsFiles
from .errors import SdkErrors
from .protocol import ContainerSpec


class DockerDialect:
    name = "docker"
    errors = SdkErrors(base=(DockerException, requests.exceptions.RequestException),
                       not_found=(ImageNotFound, NotFound))
    engine_socket = "/var/run/docker.sock"
    archive_mtime = "truncate"  # moby's archive truncates a time to the second

    def connect(self, url: str, tls: TlsFiles | None) -> docker.DockerClient:
        if tls is None:
            return docker.DockerClient(base_url=url, timeout=30)
        config = TLSConfig(client_cert=tls.client_cert, ca_cert=tls.ca, verify=tls.verify)
        # requests lets REQUESTS_CA_BUNDLE/CURL_CA_BUNDLE replace a session's own CA
        # (psf/requests#3829), and the SDK asks the engine's API version inside its
        # constructor: ask it here with the environment ignored, then do the same for the SDK.
        with requests.Session() as probe:
            probe.trust_env = False
            config.configure_client(probe)
            https = url.replace("tcp://", "https://", 1)
            version = probe.get(f"{https}/version", timeout=30).json()["ApiVersion"]
        client = docker.DockerClient(base_url=url, timeout=30, tls=config, version=version)
        client.api.trust_env = False
        return client

    def ping(self, client: docker.DockerClient) -> bool:
        return bool(client.ping())

    def pull_events(self, client: docker.DockerClient, repository: str, tag: str,
                    auth: dict[str, str] | None) -> Iterator[dict[str, Any]]:
        events: Iterator[dict[str, Any]] = client.api.pull(repository, tag, stream=True, decode=True,
                                                           auth_config=auth)
        return events

    def inspect_image(self, client: docker.DockerClient, image: str) -> None:
        client.api.inspect_image(image)

    def create(self, client: docker.DockerClient, spec: ContainerSpec) -> str:
        h = spec.hardening
        api = client.api
        mounts = [Mount(target=dst, source=src, type="bind", read_only=ro,
                        propagation="rslave" if dst in spec.slave_binds else None)
                  for src, dst, ro in spec.binds]
        # no_copy: an empty volume must stay empty, whatever the image has at that path
        mounts += [Mount(target=dst, source=name, type="volume", read_only=ro, no_copy=True)
                   for name, dst, ro in spec.volumes]
        host: dict[str, Any] = {
            "network_mode": h.limits.engine_network, "read_only": h.read_only_root,
            "tmpfs": {"/tmp": f"rw,size={h.limits.tmpfs_size},mode=1777"}, "init": h.init,
            "mounts": mounts, "pids_limit": h.limits.pids, "mem_limit": h.limits.memory,
            "ulimits": [Ulimit(name="nofile", soft=h.nofile, hard=h.nofile),
                        Ulimit(name="nproc", soft=h.nproc, hard=h.nproc)],
        }
        if spec.stdin_open:
            # the channel is the container's stdout: the engine must not keep a log of it
            host["log_config"] = LogConfig(type=LogConfig.types.NONE)
        if spec.auto_remove:
            host["auto_remove"] = True
        if h.limits.cpus is not None:
            host["nano_cpus"] = int(h.limits.cpus * 1e9)
        if h.limits.network == "egress":
            # the agent's resolver and captured low ports without a capability (docker's own
            # default since 20.10, set here for older ones); --dns reaches copy mode's
            # resolv.conf too (bind mode mounts one)
            host["sysctls"] = {"net.ipv4.ip_unprivileged_port_start": "0"}
            host["dns"] = ["127.0.0.53"]
        if h.drop_all_capabilities:
            host["cap_drop"] = ["ALL"]
        if h.no_new_privileges:
            host["security_opt"] = ["no-new-privileges"]
        # detach: no StdinOnce — else the engine closes the agent's stdin when the first
        # attach stream ends, and a dropped connection would end the session
        created = api.create_container(
            spec.image, spec.command, name=spec.name, labels=spec.labels,
            environment=spec.environment, working_dir="/workspace", detach=True,
            stdin_open=spec.stdin_open, host_config=api.create_host_config(**host))
        return str(created["Id"])

    def start(self, client: docker.DockerClient, container: str) -> None:
        client.api.start(container)

    def attach_path(self, client: docker.DockerClient, container: str) -> str:
        return (f"/v{client.api.api_version}/containers/{container}/attach"
                "?stream=1&stdin=1&stdout=1&stderr=1")

    def request(self, client: docker.DockerClient, method: str, path: str, **kwargs: Any) -> Any:
        api = client.api
        return api.request(method, f"{api.base_url}/v{api.api_version}{path}", **kwargs)

    def changes(self, client: docker.DockerClient, container: str) -> list[dict[str, Any]]:
        return list(client.api.diff(container) or [])

    def inspect_volume(self, client: docker.DockerClient, name: str) -> None:
        client.api.inspect_volume(name)

    def create_volume(self, client: docker.DockerClient, name: str, labels: dict[str, str],
                      options: dict[str, str] | None = None) -> None:
        if options:
            client.api.create_volume(name, driver="local", driver_opts=options, labels=labels)
        else:
            client.api.create_volume(name, labels=labels)

    def remove_volume(self, client: docker.DockerClient, name: str) -> None:
        client.api.remove_volume(name, force=True)

    def volumes(self, client: docker.DockerClient, label: str) -> list[tuple[str, dict[str, str]]]:
        found = client.api.volumes(filters={"label": label})
        return [(str(v["Name"]), dict(v.get("Labels") or {})) for v in found.get("Volumes") or []]

    def commit(self, client: docker.DockerClient, container: str, change: str) -> str:
        return str(client.api.commit(container, pause=False, changes=change)["Id"])

    def remove_image(self, client: docker.DockerClient, image: str) -> None:
        client.api.remove_image(image)

    def images(self, client: docker.DockerClient, label: str) -> list[tuple[str, dict[str, str]]]:
        found = client.api.images(filters={"label": label})
        return [(str(i["Id"]), dict(i.get("Labels") or {})) for i in found]

    def arch(self, client: docker.DockerClient) -> str:
        return str(client.api.info()["Architecture"])

    def inspect_container(self, client: docker.DockerClient, container: str) -> dict[str, Any]:
        return dict(client.api.inspect_container(container))

    def logs(self, client: docker.DockerClient, container: str) -> bytes:
        return bytes(client.api.logs(container, tail=20))

    def remove_container(self, client: docker.DockerClient, container: str) -> None:
        client.api.remove_container(container, force=True, v=True)

    def containers(self, client: docker.DockerClient, label: str
                   ) -> list[tuple[str, dict[str, str]]]:
        found = client.api.containers(all=True, filters={"label": label})
        return [(str(c["Id"]), dict(c.get("Labels") or {})) for c in found]

    def close(self, client: docker.DockerClient) -> None:
        client.close()
