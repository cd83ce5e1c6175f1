"""What engine a Ray node runs its sandboxes on: the node's own environment says, never the
caller (who cannot know which engine a machine it has never seen has).

``TOOLSEAM_RAY_BACKEND``: ``podman-rootless`` (the default), ``podman``, ``docker`` or ``host``.
``TOOLSEAM_RAY_BACKEND_OPTIONS``: a JSON object of that backend's keyword options
(``endpoint``, ``image``, ``pull``, ``workspace_mode`` …; ``tls_dir`` for a docker engine over
TLS). ``TOOLSEAM_RAY_NODE_NAME`` names the node in messages (default: the host's name);
``TOOLSEAM_RAY_WORKDIR`` is where the node keeps its sessions' workspaces (default: ``ray``
below this user's staging root, ``staging.user_dir`` — never a name in the shared temp dir).

A sandbox on the engine's bridge network (``network="bridge"``, Ray's ``"public"``) could reach
the node's own address, where Ray's GCS, raylet and workers listen — and a client of those runs
code on every node. So a node refuses the bridge unless its operator has fenced those ports
off from the engine's network and says so: ``TOOLSEAM_RAY_ALLOW_BRIDGE=1`` (issue 44).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from ..backends import BACKEND_NAMES, BackendKind, backend_class, backend_kind
from ..backends.containers.engine.attach import TlsFiles
from ..backends.staging import check_owned, user_dir
from ..seam.errors import ConfigurationError
from ..seam.protocol import BuiltinExec

# what a node may run its sandboxes on: the backend table's names of local kinds
ENGINES = tuple(sorted(name for name in BACKEND_NAMES if backend_kind(name).local))
ALLOW_BRIDGE = "TOOLSEAM_RAY_ALLOW_BRIDGE"


@dataclass(frozen=True)
class NodeConfig:
    engine: str
    options: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    workdir: str = ""
    allow_bridge: bool = False  # the operator fenced the node's Ray ports from the bridge

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> NodeConfig:
        env = os.environ if environ is None else environ
        engine = env.get("TOOLSEAM_RAY_BACKEND", "podman-rootless")
        if engine not in ENGINES:
            raise ConfigurationError(f"TOOLSEAM_RAY_BACKEND is {engine!r}, not one of "
                                     f"{', '.join(ENGINES)}")
        raw = env.get("TOOLSEAM_RAY_BACKEND_OPTIONS", "") or "{}"
        try:
            options = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"TOOLSEAM_RAY_BACKEND_OPTIONS is not JSON: {exc}") from None
        if not isinstance(options, dict):
            raise ConfigurationError("TOOLSEAM_RAY_BACKEND_OPTIONS must be a JSON object")
        workdir = env.get("TOOLSEAM_RAY_WORKDIR", "")  # "": the default (node.own_workdir)
        return cls(engine, options, env.get("TOOLSEAM_RAY_NODE_NAME") or socket.gethostname(),
                   workdir, env.get(ALLOW_BRIDGE, "") == "1")

    @property
    def kind(self) -> BackendKind:
        return backend_kind(self.engine)

    @property
    def contained(self) -> bool:
        """The node's sandboxes are containers of an engine (not its own processes)."""
        return self.kind.contained

    @property
    def endpoint(self) -> str:
        return str(self.options.get("endpoint") or "its default endpoint")

    def describe(self) -> str:
        """``docker at unix:///var/run/docker.sock`` — for messages."""
        return f"{self.engine} at {self.endpoint}" if self.contained else f"the {self.engine} backend"

    def make(self, workspace: str, image: str | None, limits: Any, lifetime: Any = None
             ) -> BuiltinExec:
        """A local backend on this node for one session, on ``workspace`` (a node-local dir);
        ``lifetime``: a durable session's (``seam/lifetime.py``), None for the default."""
        chosen = {} if lifetime is None else {"lifetime": lifetime}
        if not self.contained:
            options = dict(self.options)
            options.pop("image", None)
            local: Any = backend_class(self.kind.name)
            _check_options(local, options, self.engine)
            made: BuiltinExec = local(workspace, **options, **chosen)
            return made
        container, options = self.container_factory(image, limits)
        _check_options(container, options, self.engine)
        made = container(workspace, **options, **chosen)
        return made

    def container_factory(self, image: str | None, limits: Any) -> tuple[Any, dict[str, Any]]:
        """The container backend class of this node's engine and its options (a pool's too)."""
        if getattr(limits, "network", None) == "bridge" and not self.allow_bridge:
            raise ConfigurationError(
                f"node {self.name} refuses the engine's bridge network: a sandbox on it could "
                "reach this node's Ray ports (GCS, raylet, workers), and through them run code "
                f"on every node; its operator may allow it ({ALLOW_BRIDGE}=1 in the node's "
                "environment) once those ports are fenced off from the engine's network")
        options = dict(self.options)
        image = image or options.pop("image", None)
        options.pop("image", None)
        if image:
            options["image"] = image
        options.setdefault("workspace_mode", "copy")  # the node dir is a staging area only
        if limits is not None:
            options["limits"] = limits
        if "tls" in self.kind.own_options:  # its TLS files, named by a directory here
            tls_dir = options.pop("tls_dir", None)
            if tls_dir:
                options["tls"] = TlsFiles.from_dir(str(tls_dir))
        for option, value in self.kind.variant_options(self.engine).items():
            options.setdefault(option, value)  # podman-rootless: rootless=True
        return backend_class(self.kind.name), options


def _check_options(backend_class: type, options: dict[str, Any], engine: str) -> None:
    """A key of TOOLSEAM_RAY_BACKEND_OPTIONS the node's backend does not take is refused by
    that name and the variable's (not a TypeError from a class the user never called)."""
    parameters = inspect.signature(backend_class).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return  # it takes any name: it says itself what it refuses
    taken = [p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY]
    wrong = sorted(set(options) - set(taken) - {"tls"})  # tls: made from tls_dir
    if wrong:
        offered = sorted({*taken, "tls_dir"} - {"limits", "workspace_mode", "tls"}
                         if "tls" in backend_kind(engine).own_options
                         else set(taken) - {"limits", "workspace_mode"})
        raise ConfigurationError(
            f"TOOLSEAM_RAY_BACKEND_OPTIONS of this node has {', '.join(map(repr, wrong))}, "
            f"which the {engine} backend does not take; it takes: {', '.join(offered)}")


# --- where a node keeps its sessions' files -------------------------------------------------
WORKSPACE_DIR = "workspace"  # the first entry of a copy-back archive (workspace_copy.apply)


def session_root(workdir: str, sid: str) -> str:
    """A new private directory for one session, named after this process (its owner)."""
    return tempfile.mkdtemp(prefix=f"{os.getpid()}-{sid[:8]}-", dir=workdir)


def sweep_dead_roots(workdir: str) -> list[str]:
    """Remove the session directories whose owning node actor is gone (a node killed, a
    cluster stopped with sessions open): the janitor's rule, for the node's staging dirs.
    A name without an owner pid is left alone."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(workdir):
            pid = name.partition("-")[0]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                shutil.rmtree(os.path.join(workdir, name), ignore_errors=True)
                removed.append(name)
    return removed


def own_workdir(workdir: str) -> str:
    """The node's staging dir: ``workdir`` (``TOOLSEAM_RAY_WORKDIR``), made 0700 if missing —
    one another user planted or a symlink is refused (``staging.check_owned``), never used; none
    given, ``ray`` below this user's staging root (``staging.user_dir``, checked the same way),
    where no other local user can make the name first."""
    if not workdir:
        return str(user_dir("ray"))
    os.makedirs(workdir, mode=0o700, exist_ok=True)
    check_owned(Path(workdir), os.geteuid(), exact_owner=True)
    return workdir
