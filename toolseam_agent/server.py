"""The agent process: one channel of JSON lines, jobs on the main loop, file ops in threads,
searches in killable children.

The messages are ``wire.py``'s (one module for both ends). When the channel closes — the
host exited, crashed or was killed — every job is killed and the agent exits, so nothing it
started outlives its host; each job's own deadline is enforced here too, not by the host.
"""

from __future__ import annotations

import base64
import os
import select
import signal
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from . import (
    fd_passing,
    frames,
    ops,
    paths,
    ports,
    procscan,
    setid_guard,
    sockowner,
    tunnel,
    userns,
    walk,
    wire,
)
from .errors import FsError
from .jobroot import Roots
from .jobs import Job, SpawnError
from .loop import Loop
from .pty_ops import PtyOps, PtyTable
from .reaper import Reaper
from .searcher import Search
from .wire import ErrorKind

_ENVS_KEPT = 4
_READ_SIZE = 1 << 16
TURN_WAIT_S = 0.05  # tunnel data waits at most this long for answers being written


def _decode_bytes(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {(k[:-4] if k.endswith("_b64") else k):
                (base64.b64decode(v) if k.endswith("_b64") else _decode_bytes(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode_bytes(v) for v in obj]
    return obj


def _encode_bytes(obj: dict[str, Any]) -> dict[str, Any]:
    return {(f"{k}_b64" if isinstance(v, bytes) else k):
            (base64.b64encode(v).decode("ascii") if isinstance(v, bytes) else v)
            for k, v in obj.items()}


class Agent(PtyOps):
    def __init__(self, infd: int, outfd: int) -> None:
        self.loop = Loop()
        self.infd, self.outfd = infd, outfd
        self.jobs: dict[str, Job] = {}
        self.leaders: dict[int, Job] = {}
        self.searchers: set[int] = set()  # search processes: the agent's, never in a job
        self._next_job = 0
        # Which client connection is attached (a durable agent counts them, session_socket.py);
        # each forget-start in flight: rid -> the connection waiting for it; and the ones
        # answered while their client was gone: rid -> job id. Such a job is kept until an
        # attach shows whether its starter took that answer (issue 45).
        self.connection_number = 0
        self.start_connection: dict[Any, int] = {}
        self.forget_on_delivery: dict[Any, str] = {}
        # Environments by the host's id: a session sends its (often 2 KiB) environment once,
        # then names it. A few are kept, so a host alternating two environments stays cheap.
        self._envs: OrderedDict[int, dict[str, str]] = OrderedDict()
        self._splitter = frames.Splitter()  # lines and tunnels' data frames, as they come
        self._closing = False
        self._write_lock = threading.Lock()
        # The priority lane: answers and events go ahead of tunnel data waiting for its turn
        self._turn = threading.Condition()
        self._urgent = 0  # senders of answers and events between their turn and their write
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fs")
        # egress: listening only once asked to; exposed ports: the host opens them
        self.tunnels = tunnel.Tunnels(self.send, self.send_data, self._job_of)
        self._passing = fd_passing.Received()  # descriptors the host sent with a request
        self.ports = ports.PortForwards(self.send, self.send_bytes)
        self.subreaper = procscan.become_subreaper()
        procscan.guard_own_descriptors()
        self.reaper = Reaper(self.loop, self._exited)
        self.roots = Roots(self.loop, self.reaper,  # one per running job (jobroot.py)
                           lambda: set(self.searchers) | set(self.leaders) | set(self.ptys.by_pid))
        self.ptys = PtyTable(self.loop, self.roots)  # interactive processes (pty_ops.py)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, lambda *_: self.shut_down(stopped=True))
        os.set_blocking(infd, False)
        self.loop.add_reader(infd, self._on_input)

    # --- channel ------------------------------------------------------------------------
    def send(self, message: Mapping[str, Any]) -> None:
        line = (wire.dumps(message) + "\n").encode()
        with self._turn:
            self._urgent += 1
        try:
            self._write(line)
        finally:
            with self._turn:
                self._urgent -= 1
                if not self._urgent:
                    self._turn.notify_all()

    def send_bytes(self, data: bytes) -> None:
        """Whole lines already made (an exposed port's data)."""
        self._write(data)

    def send_data(self, number: int, data: bytes) -> None:
        """A tunnel's data frame (``frames.py``), from its connection's thread: it waits while
        an answer or event is being written, so a call's answer waits behind one frame at most."""
        with self._turn:
            self._turn.wait_for(lambda: not self._urgent, TURN_WAIT_S)
        self._write(frames.header(number, len(data)) + data)

    def _write(self, data: bytes) -> None:
        """Whole lines or frames, written without interleaving another thread's."""
        with self._write_lock:
            view = memoryview(data)
            while view:
                try:
                    view = view[os.write(self.outfd, view):]
                except BlockingIOError:
                    select.select([], [self.outfd], [])
                except OSError:
                    return  # the host is gone; shutting down follows from the input side

    def _on_input(self) -> None:
        # 64 KiB reads: a 1 MiB buffer is mmap'ed, shrunk and unmapped on every request (three
        # syscalls and a page fault each time); a big request just takes several reads.
        chunks: list[bytes] = []
        while True:
            try:
                data = self._read_input()
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                if chunks:
                    break  # answer what arrived; the end is seen on the next wakeup
                self.loop.remove_reader(self.infd)
                self._input_ended()
                return
            chunks.append(data)
            if len(data) < _READ_SIZE:
                break
        try:
            items = self._splitter.feed(b"".join(chunks))
        except frames.FrameError as exc:  # not our framing: the channel is broken
            self.send(wire.failure(None, ErrorKind.PROTOCOL, str(exc)))
            self.loop.remove_reader(self.infd)
            self._input_ended()
            return
        self._lines(items)

    def _read_input(self) -> bytes:
        """One read of the channel; on a unix socket by ``recvmsg``, keeping the descriptors
        the host passes with a request (egress's lane, ``fd_passing.py``) — a plain read would
        have the kernel drop them."""
        sock = self._passing.socket_for(self.infd)
        if sock is None:
            return os.read(self.infd, _READ_SIZE)
        return self._passing.receive(sock, _READ_SIZE)

    def _lines(self, items: list[bytes | frames.Frame]) -> None:
        """Whole lines and egress's data frames from the host, in order (a durable agent opens
        their seals first)."""
        for item in items:
            if isinstance(item, frames.Frame):
                self.tunnels.from_host_data(item.number, item.data)
            elif item.strip() and not self.ports.from_host_line(item):
                self._handle(item)

    def _input_ended(self) -> None:
        """The channel closed: the host is gone (a durable agent, session_socket.py, waits)."""
        self.shut_down()

    def _handle(self, line: bytes) -> None:
        try:
            request = wire.loads(line.decode())  # str: json skips guessing the encoding
            rid, op = request["id"], request["op"]
        except (ValueError, KeyError, TypeError) as exc:
            self.send(wire.failure(None, ErrorKind.PROTOCOL, str(exc)))
            return
        args = request.get("args") or {}
        if op in ops.INLINE or (op == "read_text" and args.get("offset") is None
                                    and args.get("refuse_above_bytes") is not None):
            # bounded point operations: a thread hand-off would cost more than they do
            self._file_op(rid, op, args)
            return
        if op in ops.FILE_OPS:  # walks may take seconds: they must not hold up job output and deadlines
            self._pool.submit(self._file_op, rid, op, args)
            return
        handler: Callable[[Any, dict[str, Any]], None] | None = (
            self._op_start if op == "start" else getattr(self, f"_op_{op}", None))
        if handler is None:
            self._fail(rid, ErrorKind.PROTOCOL, f"unknown op {op!r}")
            return
        try:
            handler(rid, request)
        except Exception as exc:  # noqa: BLE001 - the agent answers, never dies on one request
            self._fail(rid, ErrorKind.AGENT, f"{type(exc).__name__}: {exc}")

    def _answer(self, rid: Any, result: dict[str, Any]) -> None:
        self.send(wire.answer(rid, result))

    def _fail(self, rid: Any, kind: str, message: str, **extra: Any) -> None:
        self.send(wire.failure(rid, kind, message, **extra))

    def _file_op(self, rid: Any, op: str, args: dict[str, Any]) -> None:
        try:
            result = ops.FILE_OPS[op](**_decode_bytes(args))
        except FsError as exc:
            self._fail(rid, ErrorKind.FS, str(exc), **exc.to_wire())
            return
        except Exception as exc:  # noqa: BLE001 - reported to the host as an agent fault
            self._fail(rid, ErrorKind.AGENT, f"{type(exc).__name__}: {exc}")
            return
        self._answer(rid, _encode_bytes(result))

    # --- exec ops -----------------------------------------------------------------------
    def _op_hello(self, rid: Any, _request: dict[str, Any]) -> None:
        self._answer(rid, {
            "protocol": wire.PROTOCOL_VERSION, "pid": os.getpid(), "uid": os.geteuid(),
            "python": sys.version.split()[0], "subreaper": self.subreaper,
            "pid_namespace": os.getpid() == 1, "openat2": paths.openat2_available(),
            "proc_locked": STARTUP.proc_locked, "setid_guard": setid_guard.status(),
            "command_domain": setid_guard.domain_status(), "control_hidden": STARTUP.control_hidden,
            "interfaces": userns.interfaces(), "run_hidden": STARTUP.run_hidden,
            "reaper": self.reaper.mode,
        })

    def _op_egress_listen(self, rid: Any, request: dict[str, Any]) -> None:
        """Egress mode: listen on 127.0.0.1 for the commands' proxy (``tunnel.py``), and with
        ``capture`` resolve every name to an address of its own (``resolver.py``)."""
        lane = self._passing.take_lane() if request.get("fd_lane") else None
        self._answer(rid, self.tunnels.listen(request.get("ca_pem"), bool(request.get("capture")),
                                              bool(request.get("resolv_conf")), lane))

    def _job_of(self, pid: int) -> str | None:
        """The job a process belongs to: the nearest job leader or root among its ancestors
        (called from a tunnel's thread: reads a snapshot of the leaders)."""
        leaders = dict(self.leaders)
        leaders.update({job.root.pid: job for job in list(leaders.values())})
        seen = 0
        current: int | None = pid
        while current is not None and current > 1 and seen < 64:
            job = leaders.get(current)
            if job is not None:
                return str(job.id)
            current, seen = sockowner.parent_of(current), seen + 1
        return None

    def _op_tun(self, _rid: Any, request: dict[str, Any]) -> None:
        """A tunnel frame from the host: no answer (``tunnel.py``)."""
        self.tunnels.from_host(request)

    def _op_start(self, rid: Any, request: dict[str, Any]) -> None:
        if self._closing:
            self._fail(rid, ErrorKind.CLOSING, "the agent is shutting down")
            return
        self._next_job += 1
        job_id = str(request.get("job") or f"a{self._next_job}")  # hosts name jobs: events precede the answer
        if job_id in self.jobs:
            self._fail(rid, ErrorKind.PROTOCOL, f"job id {job_id!r} is in use")
            return
        try:
            spec = request["spec"]
            env = self._env_of(spec)
        except (KeyError, TypeError, AttributeError) as exc:
            self._fail(rid, ErrorKind.PROTOCOL, f"bad spec: {exc}")
            return
        try:
            job = Job(self.loop, job_id, spec, env, self.roots, self.send, self._job_done)
        except SpawnError as exc:
            self._fail(rid, ErrorKind.SPAWN, exc.strerror, errno=exc.errno, in_cwd=exc.in_cwd)
            return
        self.jobs[job_id] = job
        self.leaders[job.pid] = job
        forget = bool(request.get("forget"))
        if forget:
            self.start_connection[rid] = self.connection_number

        def answer(status: dict[str, Any]) -> None:
            connection = self.start_connection.pop(rid, None)
            if forget and status["state"] == "exited":
                if connection == self.connection_number:
                    self.jobs.pop(job_id, None)  # saves the host a release round trip
                else:  # its client left: another may attach and adopt it; keep it till then
                    self.forget_on_delivery[rid] = job_id
            self._answer(rid, status)

        job.add_waiter(answer, _seconds(request.get("wait_ms")))

    def _env_of(self, spec: dict[str, Any]) -> dict[str, str]:
        """The spec's environment: given inline, or named by an id sent before. The dict is
        kept as it is: jobs do not change it."""
        env_id = spec.get("env_id")
        if env_id is None:
            return {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        if "env" in spec:
            self._envs[env_id] = {str(k): str(v) for k, v in spec["env"].items()}
            while len(self._envs) > _ENVS_KEPT:
                self._envs.popitem(last=False)
        elif env_id not in self._envs:
            raise KeyError(f"unknown env_id {env_id}")
        else:
            self._envs.move_to_end(env_id)
        return self._envs[env_id]

    def _wait(self, rid: Any, job: Job, wait_ms: float | None) -> None:
        job.add_waiter(lambda status: self._answer(rid, status), _seconds(wait_ms))

    def _job(self, rid: Any, request: dict[str, Any]) -> Job | None:
        job = self.jobs.get(str(request.get("job")))
        if job is None:
            self._fail(rid, ErrorKind.UNKNOWN_JOB, f"no job {request.get('job')!r}")
        return job

    def _op_wait(self, rid: Any, request: dict[str, Any]) -> None:
        job = self._job(rid, request)
        if job is not None:
            self._wait(rid, job, request.get("wait_ms"))

    def _op_kill(self, rid: Any, request: dict[str, Any]) -> None:
        job = self._job(rid, request)
        if job is not None:
            job.kill("kill")
            self._wait(rid, job, None)

    def _op_release(self, rid: Any, request: dict[str, Any]) -> None:
        job = self.jobs.pop(str(request.get("job")), None)
        if job is not None and job.state != "done":
            job.kill("kill")
        self._answer(rid, {})

    def _op_grep(self, rid: Any, request: dict[str, Any]) -> None:
        """In a child process under the search's deadline (``searcher.py`` says why)."""
        args = dict(request.get("args") or {})
        deadline_ms = args.pop("deadline_ms", None)

        def done(result: dict[str, Any] | None, error: wire.ErrorBody | None) -> None:
            self.searchers.discard(search.pid)
            if error is None:
                self._answer(rid, result or {})
            else:
                self.send({"id": rid, "ok": False, "error": error})  # already wire.error()

        search = Search(self.loop, lambda: walk.grep_files(**args),
                        None if deadline_ms is None else float(deadline_ms) / 1000, done,
                        str(args.get("path", "")))
        self.searchers.add(search.pid)
        self.reaper.watch(search.pid)

    def _op_shutdown(self, rid: Any, _request: dict[str, Any]) -> None:
        self._answer(rid, {})
        self.shut_down()

    # --- lifecycle ----------------------------------------------------------------------
    def _job_done(self, job: Job) -> None:
        self.leaders.pop(job.pid, None)
        if self._closing and not self.leaders:
            self.loop.running = False

    def _exited(self, pid: int, status: int) -> None:
        """A child was reaped (``reaper.py``): a job's leader, a search or an orphan."""
        job = self.leaders.get(pid)
        if job is not None:
            used = self.reaper.last_usage  # its root was lost: the agent reaped it
            job.on_exit(status, usage=None if used is None
                        else (used.ru_utime + used.ru_stime, used.ru_maxrss))
        elif self.ptys.by_pid:
            self.ptys.on_exit(pid, status)

    def shut_down(self, stopped: bool = False) -> None:
        """Kill every job; the loop stops once none is left. ``stopped``: a signal asked it,
        not the host — the sandbox is being stopped or removed from outside, and each job's
        status says so (``sandbox_stopping``), so the host tells a sandbox that died from a
        command that failed."""
        self._closing = True
        self.ports.close()
        self.tunnels.close()
        self.ptys.kill_all()
        running = [job for job in self.jobs.values() if job.state != "done"]
        for job in running:
            job.kill("stopped" if stopped else "shutdown")
        for root in self.roots.busy():
            if root.owner is None:  # a finished job's kept detached processes
                for pid, started in procscan.descendants(root.pid).items():
                    procscan.signal_if_same(pid, started, signal.SIGKILL)
        if not self.leaders:
            self.loop.running = False

    def run(self) -> None:
        self.loop.run()
        self.roots.close()
        self._pool.shutdown(wait=True)


def _seconds(wait_ms: float | None) -> float | None:
    return None if wait_ms is None else max(0.0, float(wait_ms)) / 1000


@dataclass
class Startup:
    """What the entry point (``main.py``) did before the agent ran; ``hello`` reports it."""

    proc_locked: bool | None = None  # host agent: whether commands can no longer unmount /proc
    run_hidden: bool = False  # host agent in egress mode: /run (engine sockets, D-Bus) hidden
    control_hidden: bool = False  # host durable agent: its session directory hidden from commands


STARTUP = Startup()
