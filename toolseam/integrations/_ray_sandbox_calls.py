"""What a Ray-shaped sandbox's calls send its node's ``RemoteServer`` (``ray/node_remote.py``)
and how each answer is read: requests of the remote wire (``backends/remote``: the session's
id and secret, a seam operation, its arguments), answers turned into Ray's shape — an
``ExecResult``, the file's bytes — or raised as Ray's own ``SandboxError`` kinds and the
``OSError`` a missing file is. A call that cannot take the direct path
(``_ray_sandbox_direct.py``) is the node actor's own call once this process knows the creation
is over (``through_ray``: its answer comes back as a ``ReadAs`` that reads in Ray's shape), else
the process's waiter's (``_ray_sandbox_waiter.py``); either way errors surface at ``ray.get``.
"""

from __future__ import annotations

import asyncio
import functools
import posixpath
import uuid
from typing import Any

from ..backends.agentlink.errors import map_seam_error
from ..backends.remote.codec import dumps, loads
from ..policy.environment import CONTAINER_BASE_ENV, command_environment
from ..ray import cluster
from ..seam.errors import CouldNotRunError, FileOpError, HostError
from ..seam.models import MAX_MS, ByteContent, JobStatus, PathRef, SandboxInfo
from ..seam.protocol import ExecRequest
from ..session.raw_checks import os_error
from .ray_sandbox_types import (
    ExecResult,
    SandboxCreationError,
    SandboxExecError,
    SandboxNotFoundError,
    SandboxTimeoutError,
)

Request = tuple[str, str, str, tuple[Any, ...], dict[str, Any]]


def request(sandbox: Any, info: SandboxInfo, name: str, args: tuple[Any, ...]) -> Request:
    """The remote request of ``exec``, ``read_file`` or ``write_file`` with ``args``: commands
    start in the sandbox's ``workdir``, relative paths are from there."""
    workdir = posixpath.join(info.workspace, sandbox._workdir or ".")
    if name == "exec":
        command, timeout, cwd, env, shell = args
        argv = [shell or "/bin/bash", "-c", command] if isinstance(command, str) else command
        base = CONTAINER_BASE_ENV if info.base_env is None else info.base_env
        extra = {**sandbox._env, **(env or {})}
        job = ExecRequest(job=uuid.uuid4().hex, argv=list(argv), forget_when_done=True,
                          cwd=posixpath.join(workdir, cwd or "."), env_given=sorted(extra),
                          env=command_environment(base, (), extra),
                          deadline_ms=None if timeout is None else
                          min(MAX_MS, max(1, int(timeout * 1000))))
        return _of(sandbox, "start", {"request": job})
    ref = PathRef(base=workdir, path=args[0])
    if name == "read_file":
        return _of(sandbox, "read_bytes", {"ref": ref})
    data = args[1].encode() if isinstance(args[1], str) else bytes(args[1])
    return _of(sandbox, "write", {"ref": ref, "data": data})


def mkdir(sandbox: Any, path: str) -> Request:
    """``mkdir -p path`` (the sandbox's ``workdir``, made right after it opens)."""
    job = ExecRequest(job=uuid.uuid4().hex, argv=["mkdir", "-p", path], cwd="/",
                      env=dict(CONTAINER_BASE_ENV), forget_when_done=True)
    return _of(sandbox, "start", {"request": job})


def _of(sandbox: Any, op: str, kwargs: dict[str, Any]) -> Request:
    return (sandbox.sandbox_id, sandbox._secret, op, (), kwargs)


def payload(req: Request) -> bytes:
    """A request as the node actor's ``remote_call`` takes it (no trace context)."""
    return dumps((req, None))


def through_ray(sandbox: Any, name: str, args: tuple[Any, ...]) -> Any | None:
    """The call's ref as the node actor's own call — one actor call, ready when the call
    ended, read in Ray's shape by ``read_answer`` wherever it is read (decision 511) — once
    this process knows the creation is over; None while it runs or if it failed (the
    waiter's path waits for it or raises its failure). Inside a running event loop only an
    info already read is used: reading it would block the loop."""
    info = sandbox._info
    if info is None and asyncio._get_running_loop() is None:
        info = made_info(sandbox)
    if info is None:
        return None
    return sandbox._actor.remote_call.remote(
        payload(request(sandbox, info, name, args)), sandbox._owner, sandbox._orphan_timeout,
        reader=functools.partial(read_answer, sandbox.sandbox_id, sandbox.node_id))


def made_info(sandbox: Any) -> SandboxInfo | None:
    """The sandbox's info if its creation is over here and opened it, without waiting; None
    while it runs or if it failed (the waiter's path waits for it or raises its failure)."""
    ray = cluster.ray_module()
    made = [ref for ref in (sandbox._opened, sandbox._made) if ref is not None]
    if len(ray.wait(made, num_returns=len(made), timeout=0)[0]) < len(made):
        return None
    try:
        return opened_info(sandbox)
    except Exception:  # noqa: BLE001 - the waiter's path raises it at ray.get
        return None


def read_answer(sid: str, node_id: str, data: bytes) -> Any:
    """A node's answer (bytes of the remote wire) in Ray's shape: its value, or its failure
    as the ``RayTaskError`` of it, which ``ray.get`` raises as the failure's own kind."""
    return shaped(loads(data), sid, node_id)


def shaped(answer: Any, sid: str, node_id: str, took: float | None = None) -> Any:
    """``value``, or the failure it raises as the ``RayTaskError`` of it (a ref's value is
    read, not raised: ``ray.get`` raises a ``RayTaskError`` value as the failure's kind)."""
    try:
        return value(answer, sid, node_id, took)
    except Exception as exc:  # noqa: BLE001 - raised by ray.get, as a Ray task's failure
        ray = cluster.ray_module()
        return ray.exceptions.RayTaskError(f"sandbox {sid[:8]}…", "", exc)


def value(answer: Any, sid: str, node_id: str, took: float | None = None) -> Any:
    """A call's answer in Ray's shape (by what it is: a job's end, a file's bytes, nothing),
    or its failure raised as Ray's kinds. ``took``: the seconds the caller measured around
    the call (else the sandbox's own whole-millisecond count)."""
    if not (isinstance(answer, tuple) and len(answer) == 2 and answer[0] in ("ok", "err")):
        raise SandboxExecError(f"node {node_id[:12]} answered what is not a toolseam answer")
    if answer[0] == "err":
        raise failure(map_seam_error(answer[1]) if isinstance(answer[1], dict)
                      else HostError("a malformed error"), sid, node_id)
    if isinstance(answer[1], ByteContent):
        return answer[1].data
    if not isinstance(answer[1], JobStatus):
        return None
    status = answer[1]
    if status.timed_out:
        raise SandboxTimeoutError("the command was killed after its timeout")
    code = status.exit_code if status.exit_code is None or status.exit_code >= 0 else (
        128 - status.exit_code)
    return ExecResult(128 if code is None else code,
                      "".join(c.text for c in status.chunks if c.stream == "stdout"),
                      "".join(c.text for c in status.chunks if c.stream == "stderr"),
                      took if took is not None else status.duration_ms / 1000)


def failure(exc: Exception, sid: str, node_id: str) -> Exception:
    """A seam failure as Ray's sandbox reads it."""
    if isinstance(exc, FileOpError):
        return os_error(exc, exc.path or "")
    if isinstance(exc, HostError) and str(exc).startswith("no session "):
        return SandboxNotFoundError(f"sandbox {sid[:8]}…: no session answers this handle "
                                    "(deleted, expired, or never made)")
    reason = exc.reason if isinstance(exc, CouldNotRunError) else str(exc)
    return SandboxExecError(f"node {node_id[:12]}: {reason}")


def opened_info(sandbox: Any) -> SandboxInfo:
    """The sandbox's info once its creation is over (waiting for it), or its failure raised
    as ``SandboxCreationError`` naming the node."""
    if sandbox._info is None:
        ray = cluster.ray_module()
        answers = [loads(ray.get(ref)) for ref in (sandbox._opened, sandbox._made) if ref]
        for answer in answers:
            if answer[0] != "ok":
                where = ray.get(sandbox._ready)["where"]
                exc = map_seam_error(answer[1])
                reason = exc.reason if isinstance(exc, CouldNotRunError) else str(exc)
                raise SandboxCreationError(f"{where}: {reason}")
        sandbox._info = answers[0][1][0]
    info: SandboxInfo = sandbox._info
    return info

