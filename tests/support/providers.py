"""Options that point a framework provider (toolseam.integrations) at each test backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .engines import IMAGE, LOCAL_BACKENDS, endpoint, shared_dir

PROVIDER_BACKENDS = LOCAL_BACKENDS


def provider_options(engine: str) -> tuple[str, dict[str, Any], Path | None]:
    """``(backend, options, workspace made for it)``: the host and rootful engines use the
    provider's own temporary workspace; rootless podman's user needs a directory it can reach."""
    if engine == "host":
        return "host", {}, None
    options: dict[str, Any] = {"image": IMAGE, "backend_options": {
        "endpoint": endpoint(engine), "rootless": engine == "podman-rootless"}}
    if engine == "docker":
        options["backend_options"].pop("rootless")
        return "docker", options, None
    if engine == "podman-rootless":
        made = shared_dir()
        options["workspace"] = str(made)
        return "podman", options, made
    return "podman", options, None
