"""What podman-py spells its own way (``engine.Dialect``). Imports the podman SDK: an extra."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import requests
from podman import PodmanClient
from podman.api import encode_auth_header
from podman.errors import ImageNotFound, NotFound, PodmanError

from .attach import TlsFiles
from .errors import SdkErrors
from .protocol import ContainerSpec


class PodmanDialect:
    name = "podman"
    errors = SdkErrors(base=(PodmanError, requests.exceptions.RequestException),
                       not_found=(ImageNotFound, NotFound))
    engine_socket = "/run/podman/podman.sock"
    archive_mtime = "round"  # Go's tar writer rounds a time to the nearest second

    def connect(self, url: str, tls: TlsFiles | None) -> PodmanClient:
        return PodmanClient(base_url=url, timeout=30)

    def ping(self, client: PodmanClient) -> bool:
        return bool(client.ping())

    def pull_events(self, client: PodmanClient, repository: str, tag: str,
                    auth: dict[str, str] | None) -> Iterator[dict[str, Any]]:
        """The libpod pull stream, read line by line and closed after (podman-py's own
        streaming pull leaves its response open when the caller stops early)."""
        token = encode_auth_header(auth) if auth else ""
        headers = {"X-Registry-Auth": token.decode() if isinstance(token, bytes) else token}
        params = {"reference": f"{repository}:{tag}" if not tag.startswith("sha256:")
                  else f"{repository}@{tag}", "policy": "always", "compatMode": True}
        response = client.api.post("/images/pull", params=params, stream=True, headers=headers)
        try:
            response.raise_for_status(not_found=ImageNotFound)
            for line in response.iter_lines():
                if line:
                    yield json.loads(line)
        finally:
            response.close()

    def inspect_image(self, client: PodmanClient, image: str) -> None:
        client.images.get(image)

    def create(self, client: PodmanClient, spec: ContainerSpec) -> str:
        h = spec.hardening
        mounts: list[dict[str, Any]] = [
            {"type": "bind", "source": src, "target": dst, "read_only": ro,
             **({"propagation": "rslave"} if dst in spec.slave_binds else {})}
            for src, dst, ro in spec.binds]
        mounts.append({"type": "tmpfs", "source": "tmpfs", "target": "/tmp",
                       "size": h.limits.tmpfs_size, "mode": "1777"})
        # nocopy: an empty volume must stay empty, whatever the image has at that path
        volumes = {name: {"bind": dst, "mode": "ro" if ro else "rw", "extended_mode": ["nocopy"]}
                   for name, dst, ro in spec.volumes}
        options: dict[str, Any] = {
            "name": spec.name, "labels": spec.labels, "environment": spec.environment,
            "working_dir": "/workspace", "network_mode": h.limits.engine_network,
            "read_only": h.read_only_root,
            "read_write_tmpfs": False, "mounts": mounts, "volumes": volumes, "init": h.init,
            "runtime": "runc", "pids_limit": h.limits.pids, "mem_limit": h.limits.memory,
            "ulimits": [{"Name": "nofile", "Soft": h.nofile, "Hard": h.nofile},
                        {"Name": "nproc", "Soft": h.nproc, "Hard": h.nproc}],
        }
        if spec.stdin_open:
            # the channel is the container's stdout: the engine must not keep a log of it
            options.update(stdin_open=True, log_config={"Type": "none"})
        if spec.auto_remove:
            options["auto_remove"] = True
        if h.limits.cpus is not None:  # podman-py refuses nano_cpus: the same as a quota per period
            options["cpu_period"] = 100_000
            options["cpu_quota"] = int(h.limits.cpus * 100_000)
        if h.limits.network == "egress":
            # the agent's resolver (:53) and captured ports (22, 80, 443 …) without a capability:
            # the sandbox's own network namespace only (docker sets this by default)
            options["sysctls"] = {"net.ipv4.ip_unprivileged_port_start": "0"}
        if h.drop_all_capabilities:
            options["cap_drop"] = ["all"]
        if h.no_new_privileges:
            options["no_new_privileges"] = True
        return str(client.containers.create(spec.image, spec.command, **options).id)

    def start(self, client: PodmanClient, container: str) -> None:
        client.api.post(f"/containers/{container}/start").raise_for_status()

    def attach_path(self, client: PodmanClient, container: str) -> str:
        return (f"/v4.0.0/libpod/containers/{container}/attach"
                "?stream=true&stdin=true&stdout=true&stderr=true")

    def request(self, client: PodmanClient, method: str, path: str, **kwargs: Any) -> Any:
        send = {"GET": client.api.get, "PUT": client.api.put, "HEAD": client.api.head}[method]
        return send(path, **kwargs)

    def changes(self, client: PodmanClient, container: str) -> list[dict[str, Any]]:
        return list(client.containers.get(container).diff() or [])

    def inspect_volume(self, client: PodmanClient, name: str) -> None:
        client.volumes.get(name)

    def create_volume(self, client: PodmanClient, name: str, labels: dict[str, str],
                      options: dict[str, str] | None = None) -> None:
        if options:
            client.volumes.create(name, labels=labels, driver="local", driver_opts=options)
        else:
            client.volumes.create(name, labels=labels)

    def remove_volume(self, client: PodmanClient, name: str) -> None:
        client.volumes.remove(name, force=True)

    def volumes(self, client: PodmanClient, label: str) -> list[tuple[str, dict[str, str]]]:
        found = client.volumes.list(filters={"label": label})
        return [(str(v.name), dict(v.attrs.get("Labels") or {})) for v in found]

    def commit(self, client: PodmanClient, container: str, change: str) -> str:
        made = client.containers.get(container).commit(pause=False, changes=[change])
        return str(made.id)

    def remove_image(self, client: PodmanClient, image: str) -> None:
        client.images.remove(image)

    def images(self, client: PodmanClient, label: str) -> list[tuple[str, dict[str, str]]]:
        found = client.images.list(filters={"label": label})
        return [(str(i.id), dict(i.attrs.get("Labels") or {})) for i in found]

    def arch(self, client: PodmanClient) -> str:
        return str(client.info()["host"]["arch"])  # type: ignore[no-untyped-call]

    def inspect_container(self, client: PodmanClient, container: str) -> dict[str, Any]:
        return dict(client.containers.get(container).attrs)

    def logs(self, client: PodmanClient, container: str) -> bytes:
        chunks = client.containers.get(container).logs(tail=20)
        return b"".join(c if isinstance(c, bytes) else str(c).encode() for c in chunks)

    def remove_container(self, client: PodmanClient, container: str) -> None:
        # timeout=0: a running container is killed at once. podman-py sends none, and podman
        # then stops it with SIGTERM and waits 10 s — which an agent still starting (pid 1,
        # its handlers not yet installed) ignores: a pool closing while a refill started took
        # 10.9 s. Nothing is lost: the agent was shut down first wherever it answered.
        client.api.delete(f"/containers/{container}", params={
            "force": True, "v": True, "volumes": True, "timeout": 0}).raise_for_status()

    def containers(self, client: PodmanClient, label: str) -> list[tuple[str, dict[str, str]]]:
        found = client.containers.list(all=True, filters={"label": label})
        return [(str(c.id), dict(c.labels or {})) for c in found]

    def close(self, client: PodmanClient) -> None:
        client.close()  # type: ignore[no-untyped-call]
