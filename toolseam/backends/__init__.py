"""Backends by name. The container backends import their engine SDKs lazily, so the host
backend works with none installed; a missing extra is a clear host error naming what to install.

The classes are here too, imported on first use: ``from toolseam.backends import
PodmanBackend`` raises ``BackendUnavailable`` naming the install line when the ``podman`` extra
is missing, where importing ``toolseam.backends.podman`` itself meets the bare
``ModuleNotFoundError`` of the engine SDK.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, cast

from pydantic import AfterValidator, WithJsonSchema

from .._extras import install_hint
from ..policy.limits import SandboxLimits
from ..seam.capabilities import DurableSessions, declared_capabilities, supports
from ..seam.errors import BackendUnavailable, ConfigurationError
from ..seam.handle import AttachError, SessionHandle
from ..seam.lifetime import EPHEMERAL, BackendLifetime, Durable
from ..seam.protocol import BuiltinExec


@dataclass(frozen=True)
class BackendKind:
    """What a front end may know of a backend before or without opening it: the ONE table of
    backend names (``KINDS``). Front ends ask it for a fact — are commands contained, which
    options only this kind takes, the engine's own command line — and never test a name; the
    CLI's choices, the front ends' option models (``KnownBackend``) and ``SessionHandle``'s
    kind are read from it."""

    name: str
    module: str
    class_name: str
    extra: str | None  # the pip extra that brings its engine SDK (or Ray)
    engine_cli: str | None  # the engine's command, pointed at an endpoint (None: no engine)
    own_options: tuple[str, ...] = ()  # keyword options of this kind alone
    engine_function: str | None = None  # in ``module``: the engine client at an endpoint
    contained: bool = True  # commands run in a sandbox, not directly on this machine
    local: bool = True  # its sandboxes live on this machine (a Ray node may host them)
    where: str = ""  # where commands run, as a model is told (``mcp`` instructions)
    # a name an open backend of this kind reports (``BuiltinExec.name``, a handle's
    # ``backend``) beyond the kind's own, with the options that make it
    variants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # what a name alone cannot give (None: a name builds it): ``Toolkit(NAME)``, the CLI's
    # ``--backend`` choices and the front ends' option models leave such a kind out
    needs: str | None = None

    def variant_options(self, name: str) -> dict[str, Any]:
        """The options that make a backend of this kind report ``name`` (none for the kind's
        own name)."""
        return dict(self.variants.get(name, {}))


KINDS: dict[str, BackendKind] = {kind.name: kind for kind in (
    BackendKind("host", "toolseam.backends.host", "HostBackend", None, None, contained=False,
                where="directly on this machine"),
    BackendKind("podman", "toolseam.backends.podman", "PodmanBackend", "podman",
                "podman --url", ("rootless",), "podman_engine", where="a podman container",
                variants={"podman-rootless": {"rootless": True}}),
    BackendKind("docker", "toolseam.backends.docker", "DockerBackend", "docker",
                "docker -H", ("tls",), "docker_engine", where="a docker container"),
    # Ray is an extra: its backend module imports Ray only when a session opens
    BackendKind("ray", "toolseam.ray.backend", "RayBackend", "ray", None,
                ("resources", "strategy", "address", "node", "orphan_timeout_s", "direct"),
                local=False, where="a sandbox on a node of a Ray cluster"),
    BackendKind("remote", "toolseam.backends.remote", "RemoteBackend", None, None,
                ("transport", "hosted", "branch"), local=False,
                where="a sandbox a toolseam remote server hosts",
                needs="a transport: build RemoteBackend(transport=..., hosted=HostedSpec(...)) "
                      "and pass the instance (docs/architecture.md)"),
)}
# the names a user may choose a backend by alone
BACKENDS: tuple[str, ...] = tuple(name for name, kind in KINDS.items() if kind.needs is None)
DEFAULT_BACKEND = "host"
# what an open backend calls itself beyond the kind's name (``BuiltinExec.name``)
_RUNTIME_NAMES = {variant: kind.name for kind in KINDS.values() for variant in kind.variants}
# every name a backend goes by: the kinds' and their variants' (``SessionHandle.backend``)
BACKEND_NAMES: frozenset[str] = frozenset([*KINDS, *_RUNTIME_NAMES])


def _unknown(name: str) -> str:
    return f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}"


def backend_kind(name: str) -> BackendKind:
    """The kind of a backend by the name a user gave or an open backend reports
    (``podman-rootless`` is podman's); an unknown name raises ``BackendUnavailable`` listing
    the known ones."""
    kind = KINDS.get(_RUNTIME_NAMES.get(name, name))
    if kind is None:
        raise BackendUnavailable(_unknown(name))
    return kind


def _known_backend(name: str) -> str:
    if name not in BACKENDS:
        raise ValueError(_unknown(name))
    return name


# a backend name in a front end's option model: one of the table's, its JSON schema an enum
KnownBackend = Annotated[str, AfterValidator(_known_backend),
                         WithJsonSchema({"type": "string", "enum": list(BACKENDS)})]


def backend_class(name: str) -> type[BuiltinExec]:
    """The class of a backend by name, its module imported now; a missing extra raises
    ``BackendUnavailable`` naming what to install."""
    if name not in KINDS:
        raise BackendUnavailable(_unknown(name))
    kind = KINDS[name]
    module_name, class_name, extra = kind.module, kind.class_name, kind.extra
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


def engine_for(name: str, endpoint: str | None, **options: Any) -> Any:
    """The engine client of a container backend kind at ``endpoint`` (its default when None),
    for work on the engine itself (``toolseam recover``); ``options`` are the kind's own."""
    kind = backend_kind(name)
    stray = sorted(set(options) - set(kind.own_options))
    if kind.engine_function is None or stray:
        what = f"the option(s) {', '.join(stray)}" if stray else "an engine"
        raise ConfigurationError(f"the {name} backend has no {what}")
    backend_class(kind.name)  # its SDK is an extra: a missing one is named with its install line
    return getattr(importlib.import_module(kind.module), kind.engine_function)(endpoint, **options)


def create_backend(name: str, **options: Any) -> BuiltinExec:
    """A backend instance by name (a row of ``KINDS``); an option the backend
    does not take raises ``ConfigurationError`` naming it and the ones it takes."""
    kind = backend_kind(name)
    if kind.needs is not None:
        raise BackendUnavailable(f"the {kind.name} backend needs {kind.needs}")
    cls = backend_class(name)
    check_backend_options(name, cls, options)
    return cls(**options)


def check_backend_options(name: str, cls: type, options: Mapping[str, Any]) -> None:
    """Refuse an option ``cls`` does not take in the user's terms (the backend's name and
    ``backend_options``), not as the ``TypeError`` of a class the user never called."""
    parameters = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    known = list(parameters)
    unknown = sorted(set(options) - set(known))
    if not unknown:
        return
    guesses = [f"{word!r} (did you mean {close[0]!r}?)" if close else repr(word)
               for word in unknown
               for close in [difflib.get_close_matches(word, known, n=1)]]
    raise ConfigurationError(f"backend_options: unknown option{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(guesses)} for the {name} backend; it takes "
                             f"{', '.join(known)}")


def backend_for(name: str, base_dir: str | None, limits: SandboxLimits,
                options: Mapping[str, Any], pull: str = "missing",
                lifetime: BackendLifetime = EPHEMERAL) -> BuiltinExec:
    """The backend a ``Toolkit`` builds from a name: the host works in the base dir; container
    engines get the session's limits (the host backend has no engine to enforce them). A
    backend that keeps sessions past their client is built with the session's ``lifetime``
    (one that keeps none is built as it is: the session refuses a durable lifetime at open)."""
    chosen = dict(options)
    if isinstance(lifetime, Durable) and supports(backend_class(name), DurableSessions):
        chosen.setdefault("lifetime", lifetime)
    if not backend_kind(name).contained:
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
        if "pull" in inspect.signature(backend_class(name)).parameters:  # an engine's images
            chosen.setdefault("pull", pull)
    return create_backend(name, **chosen)


def backend_for_handle(handle: SessionHandle, options: dict[str, Any]) -> BuiltinExec:
    """A backend of the handle's kind, for its workspace and engine (not yet open): the kind's
    class reads its own handle back (``from_handle``); a kind that keeps no such session, or a
    name the table does not know, is ``AttachError("unsupported")``."""
    try:
        kind = backend_kind(handle.backend)
    except BackendUnavailable as exc:
        raise AttachError("unsupported", f"session handle: {exc}") from None
    cls = backend_class(kind.name)
    if DurableSessions not in declared_capabilities(cls):
        raise AttachError("unsupported", f"the {kind.name} backend keeps no session a handle "
                          "can attach to")
    # declared, so the class has it (tests/unit/test_capabilities.py checks each declaration)
    durable = cast(type[DurableSessions], cls)
    made: BuiltinExec = durable.from_handle(handle, {**kind.variant_options(handle.backend),
                                                     **options})
    return made


_CLASSES = {kind.class_name: name for name, kind in KINDS.items()}


def __getattr__(attribute: str) -> Any:
    # PEP 562: the classes load on first use, so importing this package needs no engine SDK
    if attribute in _CLASSES:
        return backend_class(_CLASSES[attribute])
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


__all__ = ["BACKENDS", "BACKEND_NAMES", "DEFAULT_BACKEND", "KINDS", "BackendKind",
           "DockerBackend", "HostBackend",  # the classes: lazy
           "KnownBackend", "PodmanBackend", "RayBackend",
           "backend_class", "backend_for", "backend_kind", "create_backend", "engine_for"]
