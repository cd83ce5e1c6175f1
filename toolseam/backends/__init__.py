"""Backends by name. The container backends import their engine SDKs lazily, so the host
backend works with none installed; a missing extra is a clear host error naming what to install.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from ..policy.limits import SandboxLimits
from ..seam.errors import BackendUnavailable, ConfigurationError
from ..seam.protocol import BuiltinExec

BACKENDS = ("host", "podman", "docker")
_WHERE = {
    "host": ("toolseam.backends.host", "HostBackend", None),
    "podman": ("toolseam.backends.podman", "PodmanBackend", "podman"),
    "docker": ("toolseam.backends.docker", "DockerBackend", "docker"),
}


def create_backend(name: str, **options: Any) -> BuiltinExec:
    """A backend instance by name (``host``, ``podman``, ``docker``)."""
    if name not in _WHERE:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module_name, class_name, extra = _WHERE[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if extra is None or exc.name in (module_name,):
            raise
        raise BackendUnavailable(
            f"the {name} backend needs the {exc.name!r} package: pip install 'toolseam[{extra}]'"
        ) from None
    backend: BuiltinExec = getattr(module, class_name)(**options)
    return backend


def backend_for(name: str, base_dir: str | None, limits: SandboxLimits,
                options: Mapping[str, Any], pull: str = "missing") -> BuiltinExec:
    """The backend a ``Toolkit`` builds from a name: the host works in the base dir; container
    engines get the session's limits (the host backend has no engine to enforce them)."""
    chosen = dict(options)
    if name == "host":
        if base_dir:
            chosen.setdefault("workspace", base_dir)
        if not limits.is_default:
            raise ConfigurationError("limits (memory, cpus, pids, network, tmpfs_size) are "
                                     "enforced by a container engine; the host backend has none")
    else:
        chosen.setdefault("limits", limits)
        chosen.setdefault("pull", pull)
    return create_backend(name, **chosen)


__all__ = ["BACKENDS", "backend_for", "create_backend"]
