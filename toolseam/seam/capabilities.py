"""Optional capabilities of a backend, beside the protocol every backend has
(``protocol.py``): a front end asks the backend for one and gets a clear "not supported" where
it is missing, never a test of the backend's class or name (inspect_ai's sandbox environments
and anyio's backends do the same).

Each backend declares what it has — ``capabilities``, a frozenset of these protocols (and
``protocol.WorkspaceTransfer``), on its class or, for a wrapper, on the instance — and
``supports`` reads that declaration alone: a method of the right name is never taken for a
capability (``tests/unit/test_capabilities.py`` checks each declaration against the methods).

* ``Egress`` — the sandbox's connections carried to this process's egress proxy
  (``limits.network = "egress"``): every backend whose commands an agent runs, and Ray's.

* ``DurableSessions`` — a sandbox that outlives its client (docs/sessions.md): the host backend
  and the container backends, in both workspace modes, and the remote backend hosting them.
* ``EngineShell`` — the engine's own command line for a shell in the sandbox (inspect_ai's
  ``connection()``): the container backends.
* ``ExposedPorts`` — a sandbox port reachable from this machine over the session's channel
  (``tools.sandbox.expose``): every backend whose commands an agent runs.
* ``InteractiveProcesses`` — programs on a terminal, written to and read over many calls
  (``interactive.py``): every backend whose commands an agent runs.
* ``Branching`` — the session's files kept as a snapshot, restored in place, or opened as new
  sessions of the same kind (docs/branching.md): the host backend and the container backends.
* ``SandboxKill`` — end the sandbox from outside its session, from any thread
  (``toolseam ps --kill``): the container backends, the host backend and Ray's (through its
  node actor).
* ``SandboxRootOwner`` — the host uid the sandbox's root writes a bind-mounted workspace as,
  where it is another than this process's (rootless podman's engine user, this process being
  root): what a front end that makes a workspace directory for a session hands it to (the
  container backends).
* ``ResourceUsage`` — what the whole sandbox has used (CPU, memory, processes), measured by
  its engine's cgroup statistics or, on the host, the agent's process tree: the container
  backends, the host backend and Ray's (its node's engine).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .errors import ConfigurationError
from .handle import SessionHandle
from .interactive import InteractiveUnsupportedError, PtyOutput, PtyProcess
from .lifetime import EPHEMERAL, BackendLifetime


def declared_capabilities(backend: object) -> frozenset[type]:
    """What ``backend`` (a backend or its class) declares it has: its ``capabilities``."""
    declared: object = getattr(backend, "capabilities", frozenset())
    return declared if isinstance(declared, frozenset) else frozenset()


def supports(backend: object, capability: type) -> bool:
    """Whether ``backend`` has ``capability`` (a protocol of this module, or
    ``WorkspaceTransfer``): what the backend declares, never a guess from a method name."""
    return capability in declared_capabilities(backend)


def _name(backend: object) -> str:
    return str(getattr(backend, "name", type(backend).__name__))


@runtime_checkable
class DurableSessions(Protocol):
    """What ``toolseam.session.durable`` needs of a backend to keep a session past its client."""

    @classmethod
    def from_handle(cls, handle: SessionHandle, options: dict[str, Any]) -> Any:
        """A backend (not open) for the sandbox ``handle`` names — its own kind's handle, from
        ``durable_handle`` — with the caller's ``options`` (``backends.backend_for_handle``)."""

    @property
    def lifetime(self) -> BackendLifetime:
        """How long the sandbox lives (``seam/lifetime.py``): chosen when the backend was
        built — ``Durable`` starts a durable agent, or attaches to the one its ``adopt``
        handle names — and never changed after."""

    def durable_handle(self, session_id: str, secret: str) -> SessionHandle:
        """Where the open sandbox is, for another process to attach."""

    async def detach(self) -> None:
        """End this client's part; the sandbox and its jobs go on."""

    async def keep_state(self, part: str, state: Any, text: str | None = None) -> None:
        """Keep ``state`` with the sandbox's agent (sealed: ``agentlink/durable.py``);
        ``text``: its canonical JSON, when the caller has it already."""

    def kept_state(self, part: str) -> Any:
        """What the last attach found kept as ``part`` (None if nothing), its seal checked.

        Raises:
            AttachError: ``tampered`` — something in the sandbox changed it.
        """

    def attached_jobs(self) -> list[dict[str, Any]]:
        """The jobs the agent reported at the last attach (``job``, ``argv``, ``pid``,
        ``started``, ``state``)."""

    async def keep_backend_state(self) -> None:
        """Keep what the backend itself needs after a client's death (copy mode's baseline)."""


@dataclass(frozen=True)
class ShellAccess:
    container: str  # the engine's id of the sandbox's container
    command: str  # ``podman --url … exec -it … bash -l``


@runtime_checkable
class EngineShell(Protocol):
    """A sandbox an engine runs, reachable by the engine's own command line."""

    def shell_access(self, user: str | None = None) -> ShellAccess | None:
        """How to open a login shell in the open sandbox (None before open)."""


def durable_sessions(backend: object) -> DurableSessions:
    """``backend`` as a ``DurableSessions``; a ``ConfigurationError`` naming the setting when
    it cannot keep a session past its client."""
    if supports(backend, DurableSessions):
        return backend  # type: ignore[return-value]
    raise ConfigurationError(f"orphan_timeout_s: the {_name(backend)} backend cannot keep a "
                             "session past its client (host, podman, docker, remote and ray "
                             "can)")


def lifetime_of(backend: object) -> BackendLifetime:
    """The lifetime ``backend`` was built with; ``Ephemeral`` for one that keeps no session
    past its client."""
    if supports(backend, DurableSessions):
        return durable_sessions(backend).lifetime
    return EPHEMERAL


class ExposedPort(Protocol):
    """A sandbox port reachable from this machine (``ExposedPorts.expose_port``)."""

    host: str  # where the listener is (127.0.0.1 unless the owner asked for another address)
    port: int  # its port here
    sandbox_port: int  # the port inside, at the sandbox's own 127.0.0.1

    async def close(self) -> None:
        """Stop listening (a connect is refused from then on) and end every connection."""


@runtime_checkable
class ExposedPorts(Protocol):
    """A port of the sandbox carried to a listener here over the session's own channel (no
    network needed inside): a tunnel for the session's owner — a connection from any other
    local user's socket, or from no local socket, is closed unread — closed with the session."""

    async def expose_port(self, port: int, host: str, host_port: int) -> ExposedPort:
        """Listen on ``host:host_port`` (0: a free port) here; each connection accepted is
        carried to ``127.0.0.1:port`` in the sandbox — a refused one there closes it here.

        Raises:
            OSError: the listener could not be made here (the address is in use, say).
            CouldNotRunError: the sandbox is gone.
        """


@runtime_checkable
class Egress(Protocol):
    """The sandbox's outgoing connections carried to this process, where the session's egress
    proxy (``toolseam.egress``) decides each one; the sandbox itself has loopback alone."""

    # the network mode the backend was built with ("none", "bridge", "egress", "host"), which
    # a toolkit's settings must agree with; None: the hosted backend's own (a remote client)
    network: str | None

    async def open_egress(self, serve: Any, ca_pem: str | None,
                          ports_for: Any = None) -> dict[str, object]:
        """Start carrying: each connection a command makes to the agent's listener is served
        here by ``serve``; with ``ports_for``, names resolve to captured addresses. Returns the
        agent's ``port``, the ``ca_file`` it wrote and ``capture`` (None, or why not).

        Raises:
            CouldNotRunError: the sandbox sees a network interface besides loopback.
        """


def egress(backend: object) -> Egress:
    """``backend`` as ``Egress``; a ``ConfigurationError`` naming it when it has none."""
    if supports(backend, Egress):
        return backend  # type: ignore[return-value]
    raise ConfigurationError(f"network 'egress': the {_name(backend)} backend has no agent "
                             "channel to carry it")


@runtime_checkable
class SandboxRootOwner(Protocol):
    """Whose a bind-mounted workspace must be for the sandbox's root to reach it."""

    def sandbox_root_uid(self) -> int | None:
        """The host uid the sandbox's root is (a local engine socket's owner: rootless
        podman's user); None where the engine is not on this machine (it works on a copy)."""


def hand_workspace_to_sandbox(backend: object, directory: str) -> None:
    """A directory this process made for ``backend``'s session (0700, this user's), given to
    the uid the sandbox's root is where that is another user (rootless podman, run as root):
    opening it to every local user instead would hand the session's files to all of them.
    Nothing for a backend without ``SandboxRootOwner`` or whose root is this user."""
    uid = backend.sandbox_root_uid() if supports(backend, SandboxRootOwner) else None  # type: ignore[attr-defined]
    if uid is not None and uid != os.geteuid():
        os.chown(directory, uid, -1)


def exposed_ports(backend: object) -> ExposedPorts:
    """``backend`` as ``ExposedPorts``; a ``ConfigurationError`` naming it when it has none."""
    if supports(backend, ExposedPorts):
        return backend  # type: ignore[return-value]
    name = _name(backend)
    raise ConfigurationError(f"expose: the {name} backend cannot carry a sandbox port here "
                             "(host, podman and docker can)")
@runtime_checkable
class InteractiveProcesses(Protocol):
    """Programs on a terminal the host writes to and reads from over many calls (a REPL, a
    password prompt, a full-screen program), started like the session's commands (its
    environment, limits and guards); all of them end with the session."""

    async def pty_start(self, argv: Sequence[str], cwd: str, env: Mapping[str, str],
                        rows: int, cols: int, tty: bool) -> int:
        """Start ``argv`` on a new terminal of ``rows`` x ``cols`` (``tty=False``: on pipes);
        its id.

        Raises:
            InteractiveLimitError: 64 are running already.
            FileOpError: ``not_found`` — ``cwd`` does not exist.
            CouldNotRunError: it could not be started (the program missing, say).
        """

    async def pty_write(self, pty: int, data: bytes) -> None:
        """Give ``data`` to the program's input; returns once its terminal has taken it.

        Raises:
            UnknownProcessError: no such process.
            ProcessExitedError: it ended before taking all of it.
            InteractiveLimitError: more than 1 MiB of its input waits already.
        """

    async def pty_read(self, pty: int, yield_ms: int, max_bytes: int) -> PtyOutput:
        """Its output not read yet, at most ``max_bytes``: at once when there is some, else
        once some comes, it ends, or ``yield_ms`` passes. A read that reports the exit
        forgets the id.

        Raises:
            UnknownProcessError: no such process.
        """

    async def pty_resize(self, pty: int, rows: int, cols: int) -> None:
        """Set its terminal's size (the program gets SIGWINCH).

        Raises:
            UnknownProcessError: no such process.
        """

    async def pty_terminate(self, pty: int) -> int | None:
        """Hang it up (SIGHUP to its process group and all it started; SIGKILL to what is
        left after a second) and forget it; its exit status, if it was learnt.

        Raises:
            UnknownProcessError: no such process.
        """

    async def pty_list(self) -> list[PtyProcess]:
        """The processes the sandbox has: running, or ended with output not read."""


def supports_interactive(backend: object) -> bool:
    """Whether ``backend`` runs interactive processes (a real capability, never a guess)."""
    return supports(backend, InteractiveProcesses)


def interactive_processes(backend: object) -> InteractiveProcesses:
    """``backend`` as ``InteractiveProcesses``; ``InteractiveUnsupportedError`` naming it when
    it has none."""
    if supports_interactive(backend):
        return backend  # type: ignore[return-value]
    name = _name(backend)
    raise InteractiveUnsupportedError(f"the {name} backend cannot run interactive processes "
                                      "(host, podman and docker can)")


@runtime_checkable
class Branching(Protocol):
    """A session's files as a snapshot in this user's store (``backends/snapshots/``), put
    back in place, or given to a new backend of the same kind and options."""

    async def snapshot_files(self, root: str, label: str | None, session: str,
                             limit: int) -> Any:
        """The tree below ``root`` as a new snapshot (a ``toolseam.Snapshot``): files,
        directories and symlinks; fifos, sockets and devices are listed in ``left_out``.

        Raises:
            CouldNotRunError: past ``limit`` file bytes, or the sandbox is gone; nothing kept.
        """

    async def restore_files(self, root: str, snapshot_id: str) -> Any:
        """Make the tree below ``root`` exactly the snapshot's, writing nothing outside it.

        Raises:
            ConfigurationError: no such snapshot in this user's store.
            CouldNotRunError: a stored entry does not match its digest (nothing changed).
        """

    def branch_backend(self, workspace: str, snapshot_id: str) -> tuple[Any, str | None]:
        """A new backend (a ``BuiltinExec``, not open) of this one's kind and options whose
        workspace is ``workspace`` — a private directory here, made the snapshot's tree
        before this returns, unless the backend gives its sandbox the snapshot another way
        (a container fork's overlay, decision 507: then it starts empty and ``sync`` fills
        it) — and the base dir its session uses (None: the backend's own).

        Raises:
            CouldNotRunError: a stored entry does not match its digest.
        """

    def branch_home(self, root: str) -> str | None:
        """The directory on this machine a kept branch of the session whose base dir is
        ``root`` comes home to (``keep()``); None when the session's files are not on this
        machine (a remote session: its branches are kept by snapshot and restore)."""

    async def ready_branch_home(self) -> None:
        """Before a fork: the home a kept branch will be compared with brought up to date
        where it is filled only at a first sync (a local fork's overlay child forking in
        turn, decision 507); nothing for any other session."""

    async def keep_directly(self, home: Any) -> Any:
        """``keep()`` of this branch straight to its home (``home``: the home's baseline
        copy, a ``WorkspaceCopy``), returning the copy-back's ``SyncReport``; None where the
        branch's files are first brought to its private directory (every branch but a local
        fork's overlay child whose directory was never filled, decision 507)."""

    def home_stamps(self) -> dict[str, tuple[int, int] | None] | None:
        """Each name's (size, mtime_ns) in the home directory when it was last in step with
        the session's files — a copy's baseline — or None where the home IS the session's
        files (a snapshot's own sizes and times are the home's then)."""


def branching(backend: object) -> Branching:
    """``backend`` as ``Branching``; a ``ConfigurationError`` naming it when it has none."""
    if supports(backend, Branching):
        return backend  # type: ignore[return-value]
    name = _name(backend)
    raise ConfigurationError(f"snapshot: the {name} backend cannot snapshot, restore or fork "
                             "a session's files (the host, podman, docker, remote and ray "
                             "backends can)")


@dataclass(frozen=True)
class SandboxUsage:
    """What a sandbox has used so far, each figure None where it cannot be measured (rootless
    podman on cgroups v1 has no cgroup of its own) — never a guess."""

    cpu_seconds: float | None = None
    """CPU time of every process of the sandbox, those ended included."""
    memory_bytes: int | None = None
    """Memory in use now."""
    memory_peak_bytes: int | None = None
    """The most memory in use at once since the sandbox started."""
    pids: int | None = None
    """Processes now."""


@runtime_checkable
class ResourceUsage(Protocol):
    """A backend that can measure its whole sandbox (``toolseam.observability`` asks it at
    close, ``toolseam ps`` and the metrics while it runs)."""

    async def resource_usage(self) -> SandboxUsage:
        """The sandbox's usage now; every field None when it is not open or not measurable."""


@runtime_checkable
class SandboxKill(Protocol):
    """A sandbox an operator can end from outside its session (``toolseam ps --kill``)."""

    def kill_sandbox(self) -> None:
        """End the sandbox and every process it holds now, from any thread, without waiting
        for the session's event loop; the session's calls then fail as ``sandbox_lost``."""
