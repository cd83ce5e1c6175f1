"""``toolseam.integrations.ray_sandbox``: Ray's own sandbox shape
(``ray.experimental.sandbox.create``) on toolseam's engines — code written for Ray's sandbox
runs by changing its import (docs/ray.md).

``create(image=…, cpu=…, memory=…, env=…, workdir=…, ttl_seconds=…, network=…, resources=…)``
returns at once a ``RaySandbox`` whose methods are called as an actor's
(``ray.get(sb.exec.remote("make"))``) and which can be passed to Ray tasks. It is not an actor
per sandbox (≈ 90 MiB of worker process each): it is a remote session of the node's
``RemoteServer`` (``ray/node_remote.py``, the hosting ``RayBackend`` uses), opened with the
shape's options and held by a lease of its own (``owner``) that this process renews; the object
carries the node, the session's id and its secret (never in its repr), so any process holding
it can call it. Calls take the node's direct port where the holder can reach it
(``_ray_sandbox_direct.py``), else a method of the process's waiter actor
(``_ray_sandbox_waiter.py``).
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import uuid
import weakref
from typing import Any

from ..backends.remote.spec import PLACED, HostedSpec
from ..policy.limits import SandboxLimits
from ..ray import cluster
from ..ray.placement import Placement
from ..seam.errors import ConfigurationError
from . import _ray_sandbox_calls as calls
from . import _ray_sandbox_direct as direct
from . import _ray_sandbox_waiter as waiter
from .ray_sandbox_types import (
    ExecResult,
    ExecutionResult,
    SandboxCreationError,
    SandboxError,
    SandboxExecError,
    SandboxNotFoundError,
    SandboxStatus,
    SandboxTimeoutError,
)

__all__ = ["ExecResult", "ExecutionResult", "RaySandbox", "SandboxCreationError",
           "SandboxError", "SandboxExecError", "SandboxNotFoundError", "SandboxStatus",
           "SandboxTimeoutError", "create", "memory_limit"]

# Ray's network modes -> toolseam's; anything else is refused, naming these
NETWORKS = {"none": "none", "public": "bridge", "bridge": "bridge"}
DEFAULT_ORPHAN_TIMEOUT_S = 120.0
CREATE_OPTIONS = ("image", "cpu", "memory", "env", "workdir", "ttl_seconds", "network",
                  "resources", "address", "orphan_timeout_s")
# ray.experimental.sandbox.create's options for its own runtime: accepted, not applied
RAY_ONLY = frozenset({"rootless", "readonly", "dns", "capabilities", "timeout_seconds"})
# what each method's .remote(...) takes, for a call that passes something else
SIGNATURES = {"exec": "(command, timeout=None, cwd=None, env=None, shell=None)",
              "read_file": "(path)", "write_file": "(path, content)"}


class _Method:
    """``sandbox.exec.remote(...)`` -> an ObjectRef, as an actor method's."""

    def __init__(self, sandbox: RaySandbox, name: str) -> None:
        self._sandbox, self._name = sandbox, name

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._sandbox._remote(self._name, *args, **kwargs)


class RaySandbox:
    """One sandbox on a node of the cluster, shaped as Ray's ``Sandbox`` actor handle."""

    def __init__(self, actor: Any, node_id: str, env: dict[str, str] | None,
                 workdir: str | None, orphan_timeout_s: float) -> None:
        self._actor, self.node_id = actor, node_id
        self.sandbox_id, self._secret = uuid.uuid4().hex, secrets.token_urlsafe(32)
        self._owner = secrets.token_hex(16)  # its lease on the node: only its holders know it
        self._env, self._workdir = dict(env or {}), workdir
        self._orphan_timeout = orphan_timeout_s
        self._opened: Any = None  # the open's ObjectRef (its answer: the info, or why not)
        self._made: Any = None  # the workdir's mkdir, sent after the open
        self._ready: Any = None  # the node actor's ready answer: its name, its direct port
        self._info: Any = None  # the session's info, once read in this process

    def __repr__(self) -> str:  # never the secret
        return f"RaySandbox({self.sandbox_id[:8]}… on node {self.node_id[:12]})"

    exec = property(lambda self: _Method(self, "exec"))
    read_file = property(lambda self: _Method(self, "read_file"))
    write_file = property(lambda self: _Method(self, "write_file"))
    upload_file = property(lambda self: _Method(self, "upload_file"))
    download_file = property(lambda self: _Method(self, "download_file"))
    get_status = property(lambda self: _Method(self, "get_status"))
    delete = property(lambda self: _Method(self, "delete"))
    terminate = property(lambda self: _Method(self, "delete"))
    get_instance_id = property(lambda self: _Method(self, "get_instance_id"))

    def _remote(self, name: str, *args: Any, **kwargs: Any) -> Any:
        ray = cluster.ray_module()
        if name in direct.CALLS:
            try:
                call_args = _ARGS[name](*args, **kwargs)
            except TypeError as exc:  # named as the caller wrote it, not as our helper
                detail = str(exc).partition(") ")[2] or str(exc)
                raise TypeError(f"sandbox.{name}.remote{SIGNATURES[name]}: {detail}") from None
            ref = direct.call(self, name, call_args)
            return ref if ref is not None else self._through_ray(name, call_args)
        if name == "get_status":  # answers PENDING / ERROR rather than wait or fail
            return ray.put(self._status())
        if name == "delete":  # its lease dropped: the node ends the session
            _renewed.pop(self.sandbox_id, None)
            direct.forget(self.sandbox_id)
            return self._actor.remote_drop.remote(self._owner, _after=self._made or self._opened)
        if name == "get_instance_id":
            return ray.put(self.sandbox_id)
        if name == "upload_file":  # the file of the process calling, as the bytes it holds,
            local_path, remote_path = args  # through Ray (the direct port takes 64 MiB at most)
            with open(local_path, "rb") as source:
                return self._through_ray("write_file", _write_args(remote_path, source.read()))
        if name == "download_file":  # written by a task on the caller's own node
            remote_path, local_path = args
            data = self._remote("read_file", remote_path)
            return _saver(ray).options(scheduling_strategy=_here(ray)).remote(
                data, os.path.abspath(local_path))
        raise AttributeError(name)

    def _through_ray(self, name: str, args: tuple[Any, ...]) -> Any:
        """A call through Ray: the node actor's own once the creation is over here, else the
        process's waiter's (which awaits the creation)."""
        ref = calls.through_ray(self, name, args)
        return ref if ref is not None else waiter.call(self, name, args)

    def _status(self) -> SandboxStatus:
        ray = cluster.ray_module()
        pending = [ref for ref in (self._opened, self._made) if ref is not None]
        if len(ray.wait(pending, num_returns=len(pending), timeout=0)[0]) < len(pending):
            return SandboxStatus.PENDING
        try:
            calls.opened_info(self)
            ray.get(self._through_ray("exec", (["true"], None, None, None, None)))
        except SandboxNotFoundError:
            return SandboxStatus.TERMINATED
        except SandboxError:
            return SandboxStatus.ERROR
        return SandboxStatus.RUNNING


def _exec_args(command: str | list[str], timeout: float | None = None, cwd: str | None = None,
               env: dict[str, str] | None = None, shell: str | None = None) -> tuple[Any, ...]:
    if not isinstance(command, (str, list)) or not command:
        raise ValueError("exec: command must be a non-empty string or list of arguments")
    return (command, timeout, cwd, env, shell)


def _read_args(path: str) -> tuple[Any, ...]:
    if not isinstance(path, str) or not path:
        raise ValueError("read_file: path must be a non-empty string")
    return (path,)


def _write_args(path: str, content: str | bytes) -> tuple[Any, ...]:
    if not isinstance(path, str) or not path:
        raise ValueError("write_file: path must be a non-empty string")
    if not isinstance(content, (str, bytes)):
        raise ValueError(f"write_file: content must be str or bytes, not "
                         f"{type(content).__name__}")
    return (path, content)


_ARGS: dict[str, Any] = {"exec": _exec_args, "read_file": _read_args, "write_file": _write_args}
_saver_task: Any = None


def _save(data: bytes, path: str) -> None:
    tmp = f"{path}.{uuid.uuid4().hex[:8]}.part"
    with open(tmp, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def _saver(ray: Any) -> Any:
    global _saver_task
    if _saver_task is None:
        _saver_task = ray.remote(num_cpus=0, max_retries=0)(_save)
    return _saver_task


def _here(ray: Any) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # Ray: lazily
    return NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)


def create(image: str | None = None, cpu: float | None = None,
           memory: str | int | float | None = None, env: dict[str, str] | None = None,
           workdir: str | None = None, ttl_seconds: float | None = None,
           network: str = "none", resources: dict[str, float] | None = None, *,
           address: str | None = None, orphan_timeout_s: float = DEFAULT_ORPHAN_TIMEOUT_S,
           **ray_options: Any) -> RaySandbox:
    """A sandbox on a node whose resources include ``resources`` (and ``cpu``), made by the
    node's own engine; returns at once (a creation failure is raised by the first call's
    ``ray.get``, as Ray's). Held while this process lives: a sandbox nobody renews for
    ``orphan_timeout_s`` seconds is ended; ``ttl_seconds`` ends it that long after creation.
    ``workdir`` (absolute): made at creation; commands start there, relative paths are from
    there.

    Ray's options for its gVisor runtime (``RAY_ONLY``: ``rootless``, ``readonly``, ``dns``,
    ``capabilities``, ``timeout_seconds``) are accepted and do not apply (the node's engine
    decides); any other name is refused, naming it — a misspelt option is never dropped."""
    unknown = sorted(set(ray_options) - RAY_ONLY)
    if unknown:
        raise ConfigurationError(
            f"ray_sandbox.create() does not take {', '.join(map(repr, unknown))}; it takes "
            f"{', '.join(CREATE_OPTIONS)} (and Ray's {', '.join(sorted(RAY_ONLY))}, which "
            "do not apply here)")
    if network not in NETWORKS:
        raise ConfigurationError(f"network {network!r} is not offered; toolseam offers "
                                 f"{', '.join(repr(n) for n in NETWORKS)}")
    if workdir is not None and not workdir.startswith("/"):
        raise ConfigurationError(f"workdir {workdir!r}: give an absolute path in the sandbox")
    fields: dict[str, Any] = {"network": NETWORKS[network],
                              "cpus": cpu if cpu and cpu > 0 else None}
    if memory is not None:
        fields["memory"] = memory_limit(memory)
    limits = SandboxLimits(**fields)
    ray = cluster.connect(address)
    wanted = dict(resources or {})
    if cpu:
        wanted["CPU"] = float(cpu)
    node_id, actor = Placement(wanted).reach(ray)
    sandbox = RaySandbox(actor, node_id, env, workdir, orphan_timeout_s)
    sandbox._ready = actor.ready.remote()
    options: dict[str, Any] = {"limits": limits.model_dump(mode="json")}
    if image:
        options["image"] = image
    spec = HostedSpec(kind=PLACED, options=options)
    opening = (sandbox.sandbox_id, sandbox._secret, "open", (), {"spec": spec.model_dump()})
    actor.remote_touch.remote(sandbox._owner, orphan_timeout_s, ttl_seconds)  # its lease, its end
    sandbox._opened = actor.remote_call.remote(calls.payload(opening), sandbox._owner,
                                               orphan_timeout_s)
    if workdir:
        sandbox._made = actor.remote_call.remote(
            calls.payload(calls.mkdir(sandbox, workdir)), sandbox._owner, orphan_timeout_s,
            _after=sandbox._opened)
    _renew(sandbox, orphan_timeout_s)
    return sandbox


def memory_limit(memory: str | int | float) -> str:
    """Ray's memory (bytes, or ``"512Mi"``, ``"1Gi"``, ``"2G"``) as toolseam's (``"512m"``)."""
    units = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1024, "mi": 1024**2,
             "gi": 1024**3}
    if isinstance(memory, (int, float)):
        size = float(memory)
    else:
        text = memory.strip().lower().removesuffix("b")
        number = text.rstrip("kmgi")
        unit = text[len(number):]
        if unit not in units:
            raise ConfigurationError(f"memory {memory!r}: not a size like 512Mi or 2G")
        try:
            size = float(number) * units[unit]
        except ValueError:
            raise ConfigurationError(f"memory {memory!r}: not a size like 512Mi or 2G") from None
    return f"{max(1, int(size // 1024**2))}m"


# --- renewal: one thread per process renews the leases of what this process created ------
_renewed: dict[str, tuple[weakref.ref[RaySandbox], float]] = {}
_renew_lock = threading.Lock()
_renewer: threading.Thread | None = None


def _renew(sandbox: RaySandbox, orphan_timeout_s: float) -> None:
    global _renewer
    with _renew_lock:
        _renewed[sandbox.sandbox_id] = (weakref.ref(sandbox), orphan_timeout_s)
        if _renewer is None:
            _renewer = threading.Thread(target=_renew_loop, name="toolseam-ray-renew",
                                        daemon=True)
            _renewer.start()


def _renew_loop() -> None:
    """Every second, renew each live sandbox whose third of its orphan timeout has passed;
    one dropped by its holder (garbage collected) is no longer renewed, and its node ends it
    after its orphan timeout, as Ray ends an actor nobody holds."""
    last: dict[str, float] = {}
    while True:
        time.sleep(1.0)
        now = time.monotonic()
        with _renew_lock:
            items = list(_renewed.items())
        for sid, (ref, timeout) in items:
            if now - last.get(sid, 0.0) < timeout / 3:
                continue
            if _touch(ref, timeout):
                last[sid] = now
            else:
                with _renew_lock:
                    _renewed.pop(sid, None)
                last.pop(sid, None)


def _touch(ref: weakref.ref[RaySandbox], timeout: float) -> bool:
    """Renew the sandbox's lease if anyone still holds it. A function of its own: a local of
    the loop would hold the last sandbox it touched, and a dropped one would never be let go."""
    sandbox = ref()
    if sandbox is None:
        return False
    sandbox._actor.remote_touch.remote(sandbox._owner, timeout)
    return True
