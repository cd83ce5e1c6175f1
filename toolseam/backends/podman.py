"""The podman backend, rootful or rootless, through podman-py and the podman API service.

Rootless is the same code with another endpoint: the API service of the unprivileged user
(``unix:///run/user/UID/podman/podman.sock``). Container root maps to that user, so files the
sandbox creates in the workspace belong to the user and stay editable and removable by them.
"""

from __future__ import annotations

import json
import os
from typing import Any

import requests
from podman import PodmanClient
from podman.api import encode_auth_header
from podman.errors import APIError, ImageNotFound, NotFound, PodmanError

from ..policy.limits import SandboxLimits
from ..seam.errors import CouldNotRunError
from ._container_backend import DEFAULT_IMAGE, ContainerBackend
from ._container_sandbox import ContainerSpec, ContainerState, Hardening, map_engine_error
from ._pull import PullCallback, PullPolicy, follow_pull, split_reference
from ._retry import transient_retry


def default_endpoint(rootless: bool) -> str:
    if rootless or os.geteuid() != 0:
        runtime = os.environ.get("XDG_RUNTIME_DIR", f"/run/user/{os.geteuid()}")
        return f"unix://{runtime}/podman/podman.sock"
    return "unix:///run/podman/podman.sock"


_NOT_FOUND = (ImageNotFound, NotFound)


class PodmanEngine:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._client = PodmanClient(base_url=endpoint, timeout=30)

    def _do(self, call: Any) -> Any:
        try:
            return transient_retry(call)
        except (PodmanError, requests.exceptions.RequestException, OSError) as exc:
            raise map_engine_error("podman", self.endpoint, exc, _NOT_FOUND, APIError) from None

    def ping(self) -> None:
        if not self._do(self._client.ping):
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

    def run(self, spec: ContainerSpec) -> str:
        h: Hardening = spec.hardening
        mounts = [{"type": "bind", "source": src, "target": dst, "read_only": ro}
                  for src, dst, ro in spec.binds]
        mounts.append({"type": "tmpfs", "source": "tmpfs", "target": "/tmp",
                       "size": h.tmpfs_size, "mode": "1777"})
        options: dict[str, Any] = {
            "name": spec.name, "labels": spec.labels, "environment": spec.environment,
            "working_dir": "/workspace", "network_mode": h.network, "read_only": h.read_only_root,
            "read_write_tmpfs": False, "mounts": mounts, "init": h.init, "runtime": "runc",
            "pids_limit": h.pids_limit, "mem_limit": h.memory,
            "ulimits": [{"Name": "nofile", "Soft": h.nofile, "Hard": h.nofile},
                        {"Name": "nproc", "Soft": h.nproc, "Hard": h.nproc}],
        }
        if h.cpus is not None:  # podman-py refuses nano_cpus: the same as a quota per period
            options["cpu_period"] = 100_000
            options["cpu_quota"] = int(h.cpus * 100_000)
        if h.drop_all_capabilities:
            options["cap_drop"] = ["all"]
        if h.no_new_privileges:
            options["no_new_privileges"] = True

        def create_and_start() -> str:
            container = self._client.containers.create(spec.image, spec.command, **options)
            try:
                container.start()
            except Exception:
                container.remove(force=True)
                raise
            return str(container.id)

        return str(self._do(create_and_start))

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
        self._client.close()  # type: ignore[no-untyped-call]


class PodmanBackend(ContainerBackend):
    """``PodmanBackend(workspace, image=..., endpoint=..., rootless=...)``."""

    def __init__(self, workspace: str = ".", *, image: str = DEFAULT_IMAGE,
                 endpoint: str | None = None, rootless: bool = False,
                 hardening: Hardening | None = None, limits: SandboxLimits | None = None,
                 pull: PullPolicy = "missing", auth: dict[str, str] | None = None,
                 on_pull_progress: PullCallback | None = None) -> None:
        variable = "TOOLSEAM_PODMAN_ROOTLESS_URL" if rootless else "TOOLSEAM_PODMAN_URL"
        url = endpoint or os.environ.get(variable) or default_endpoint(rootless)
        super().__init__(PodmanEngine(url), "podman-rootless" if rootless else "podman", image,
                         os.path.abspath(workspace), hardening, limits, pull, auth,
                         on_pull_progress)


__all__ = ["Hardening", "PodmanBackend", "PodmanEngine"]
