"""THE table of seam operations the remote wire carries, derived from the seam's protocols: every
coroutine method of a forwarded protocol (``seam/protocol.py``, ``seam/capabilities.py``) is a
row, so a new seam method crosses the wire with no line written here. The client's methods are
made from these rows (``client.py``) and the server calls only a row's method, on a backend
that declares the row's capability (``server.py``).

A row's ``shape`` says what crosses: ``call`` — the arguments and the result, as values;
``stream`` — the same, with the callback's chunks as events (``start``'s ``on_output``);
``upload`` / ``download`` — a path of the client's machine, carried as a tar
(``workspace.py``); ``egress`` — the sandbox's connections, served by the client's proxy
(``egress.py``); ``snapshot`` / ``restore`` — a snapshot carried between the server's store and
the client user's, where it lands (``snapshots.py``, decision 445); ``usage`` — a
``SandboxUsage`` as its fields, all None before open or once the server is gone. A protocol's
other members (``WorkspaceTransfer.copy_back_error``, ``Branching``'s synchronous three and
its two hooks of a local fork's home, ``CLIENT_OWN``) are the client's own (``client.py``).

Durable sessions (``DurableSessions``) cross as requests of the session's lifetime, as ``open``
and ``close`` do, never as rows: a durable ``open``, ``attach`` (an ``open`` that adopts a
session the server kept), ``detach``, ``keep_state`` and ``keep_backend_state``; the
protocol's synchronous members are the client's own, read from what ``open`` answered
(``durable.py``, decision 476).

``SandboxKill`` crosses as the request ``kill_sandbox``, sent on a transport of its own made
from the session's address, so it waits for no event loop of the session's (``client.py``).

Not forwarded yet (the hosted backend's own, reachable only where it runs): exposed ports
(docs/architecture.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from ...seam.capabilities import (
    Branching,
    DurableSessions,
    Egress,
    InteractiveProcesses,
    ResourceUsage,
    SandboxKill,
)
from ...seam.capabilities import declared_capabilities as declared_by
from ...seam.protocol import ExecPart, FilePart, WorkspaceTransfer

Shape = Literal["call", "stream", "upload", "download", "egress", "snapshot", "restore", "usage"]

# The protocols whose operations cross; the first two are every backend's (BuiltinExec).
REQUIRED: tuple[type, ...] = (ExecPart, FilePart)
OPTIONAL: tuple[type, ...] = (WorkspaceTransfer, InteractiveProcesses, Egress, Branching,
                              ResourceUsage)
_SHAPES: dict[str, Shape] = {"start": "stream", "upload": "upload", "download": "download",
                             "open_egress": "egress", "snapshot_files": "snapshot",
                             "restore_files": "restore", "resource_usage": "usage"}


@dataclass(frozen=True, slots=True)
class SeamOp:
    """One seam operation: its method's name, the protocol that declares it, what crosses."""

    name: str
    capability: type
    shape: Shape = "call"


def _own_members(protocol: type) -> Iterator[tuple[str, object]]:
    for name, value in vars(protocol).items():
        if not name.startswith("_"):
            yield name, value


def protocol_members(protocol: type) -> frozenset[str]:
    """Every public member a protocol declares (methods, properties, annotated attributes)."""
    return frozenset(name for name, _ in _own_members(protocol)) | frozenset(
        name for name in getattr(protocol, "__annotations__", {}) if not name.startswith("_"))


# asynchronous members that are no request: a kept branch's home is on the client's machine
CLIENT_OWN = frozenset({"ready_branch_home", "keep_directly"})


def _rows() -> Iterator[SeamOp]:
    for protocol in (*REQUIRED, *OPTIONAL):
        for name, value in _own_members(protocol):
            if inspect.iscoroutinefunction(value) and name not in CLIENT_OWN:
                yield SeamOp(name, protocol, _SHAPES.get(name, "call"))


TABLE: tuple[SeamOp, ...] = tuple(_rows())
BY_NAME: dict[str, SeamOp] = {op.name: op for op in TABLE}
# Capabilities whose operations are requests of the session's lifetime (server.py), not rows:
# durable sessions, and the end of a sandbox from outside (a synchronous call, any thread)
LIFECYCLE: tuple[type, ...] = (DurableSessions, SandboxKill)
CAPABILITIES: dict[str, type] = {protocol.__name__: protocol for protocol in (*OPTIONAL,
                                                                             *LIFECYCLE)}


def declared_capabilities(backend: object) -> frozenset[str]:
    """The forwarded optional protocols ``backend`` (a backend or its class) declares, by
    name (what crosses the wire), lifetime ones included: its ``capabilities``, never its
    methods' names."""
    declared = declared_by(backend)
    return frozenset(name for name, protocol in CAPABILITIES.items() if protocol in declared)


def ops_for(capabilities: frozenset[str]) -> tuple[SeamOp, ...]:
    """The rows a backend with ``capabilities`` answers."""
    return tuple(op for op in TABLE
                 if op.capability in REQUIRED or op.capability.__name__ in capabilities)
