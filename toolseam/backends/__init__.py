"""Backends by name. The container backends import their engine SDKs lazily, so the host
backend works with none installed; a missing extra is a clear host error naming what to install.
"""

from __future__ import annotations

import importlib
from typing import Any

from ..seam.errors import BackendUnavailable
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


__all__ = ["BACKENDS", "create_backend"]
