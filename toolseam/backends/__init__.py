"""Backends by name. The container backends import their engine SDKs lazily, so the host
backend works with none installed; a missing extra is a clear host error naming what to install.

The classes are here too, imported on first use: ``from toolseam.backends import
PodmanBackend`` raises ``BackendUnavailable`` naming the install line when the ``podman`` extra
is missing, where importing ``toolseam.backends.podman`` itself meets the bare
``ModuleNotFoundError`` of the engine SDK.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from .._extras import install_hint
from ..policy.limits import SandboxLimits
from ..seam.errors import BackendUnavailable, ConfigurationError
from ..seam.handle import SessionHandle
from ..seam.protocol import BuiltinExec

BACKENDS = ("host", "podman", "docker")
_WHERE = {
    "host": ("toolseam.backends.host", "HostBackend", None),
    "podman": ("toolseam.backends.podman", "PodmanBackend", "podman"),
    "docker": ("toolseam.backends.docker", "DockerBackend", "docker"),
}


def backend_class(name: str) -> type[BuiltinExec]:
    """The class of a backend by name, its module imported now; a missing extra raises
    ``BackendUnavailable`` naming what to install."""
    if name not in _WHERE:
        raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
    module_name, class_name, extra = _WHERE[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if extra is None or exc.name in (module_name,):
            raise
        raise BackendUnavailable(
            f"the {name} backend needs the {exc.name!r} package: {install_hint(extra)}"
        ) from None
    found: type[BuiltinExec] = getattr(module, class_name)
    return found


def create_backend(name: str, **options: Any) -> BuiltinExec:
    """A backend instance by name (``host``, ``podman``, ``docker``)."""
    return backend_class(name)(**options)


def backend_for(name: str, base_dir: str | None, limits: SandboxLimits,
                options: Mapping[str, Any], pull: str = "missing") -> BuiltinExec:
    """The backend a ``Toolkit`` builds from a name: the host works in the base dir; container
    engines get the session's limits (the host backend has no engine to enforce them)."""
    chosen = dict(options)
    if name == "host":
        if base_dir:
            chosen.setdefault("workspace", os.path.expanduser(base_dir))
        if limits.network == "egress":  # the one limit the host enforces (namespaces)
            chosen.setdefault("network", "egress")
            limits = limits.model_copy(update={"network": "none"})
        if not limits.is_default:
            raise ConfigurationError("limits (memory, cpus, pids, network, tmpfs_size) are "
                                     "enforced by a container engine; the host backend has none "
                                     "(its one network mode besides the host's is 'egress')")
    else:
        chosen.setdefault("limits", limits)
        chosen.setdefault("pull", pull)
    return create_backend(name, **chosen)


def backend_for_handle(handle: SessionHandle, options: dict[str, Any]) -> BuiltinExec:
    """A backend of the handle's kind, for its workspace and engine (not yet open)."""
    if handle.backend == "host":
        host: Any = backend_class("host")
        if handle.network == "egress":
            options = {**options, "network": "egress"}
        return host(handle.workspace, **options)  # type: ignore[no-any-return]
    name = "docker" if handle.backend == "docker" else "podman"
    if handle.backend == "podman-rootless":
        options = {**options, "rootless": True}
    if handle.network in ("bridge", "egress") and "limits" not in options:
        options = {**options, "limits": SandboxLimits(network=handle.network)}
    engine: Any = backend_class(name)
    return engine(handle.workspace, image=handle.image or "",  # type: ignore[no-any-return]
                  endpoint=handle.endpoint, workspace_mode=handle.workspace_mode, **options)


_CLASSES = {class_name: name for name, (_, class_name, _) in _WHERE.items()}


def __getattr__(attribute: str) -> Any:
    # PEP 562: the classes load on first use, so importing this package needs no engine SDK
    if attribute in _CLASSES:
        return backend_class(_CLASSES[attribute])
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


__all__ = ["BACKENDS", "DockerBackend", "HostBackend", "PodmanBackend",  # the classes: lazy
           "backend_class", "backend_for", "create_backend"]
