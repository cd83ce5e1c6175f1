"""The agent's wire, in one module both ends import as ``toolseam_agent.wire``: the agent
inside the sandbox and the host. Standard library only.

One JSON object per line, UTF-8, over one socket:

* request (host → agent):  ``{"id": ID, "op": OP, ...fields}`` — file operations carry their
  arguments under ``"args"``; ``start`` carries ``"spec"`` (a ``SpawnRequest``'s fields).
* answer (agent → host):   ``{"id": ID, "ok": true, "result": {...}}`` or
  ``{"id": ID, "ok": false, "error": {"kind": KIND, "message": TEXT, ...}}``
* event (agent → host):    ``{"ev": "output", "job": JOB, "stream": "stdout"|"stderr",
  "data": TEXT}`` — live output, before the job's answer; ``{"ev": "tun", "c": N, ...}`` — an
  egress connection's control frame (``tunnel.py``); ``{"ev": "xp", ...}`` an exposed port's
  (``ports.py``).
* egress's data, both ways: a binary frame, ``NUL`` + number + length + raw bytes, where a
  line would begin (``frames.py``).

Bytes travel as base64 under keys ending in ``_b64``.
"""

from __future__ import annotations

import base64
import json
from json import encoder as _json_encoder
from json import scanner as _json_scanner
from typing import Any, Literal, TypedDict

# --- the codec: both ends, every message -----------------------------------------------------
# json's own C scanner and encoder, called directly. json.loads/json.dumps wrap them in three
# Python functions and two regex matches, and build the encoder anew on every call; a bash call
# encodes and decodes two messages at each end, and on caches gone cold while the command ran a
# message took 16 µs through json.loads/dumps and 9-10 through these (benchmarks/agent_floor.py
# measures the call). What the direct scan does not take whole (whitespace around the object, a
# stray byte) goes through json.loads, which says what is wrong. Where the C module is missing
# (another Python), json's own functions do it all.
_c_scanner: Any = getattr(_json_scanner, "c_make_scanner", None)  # typeshed leaves them out
_c_encoder: Any = getattr(_json_encoder, "c_make_encoder", None)
_scan = _c_scanner(json.JSONDecoder()) if _c_scanner is not None else None
_encode_c = (_c_encoder(None, json.JSONEncoder().default, _json_encoder.encode_basestring_ascii,
                        None, ":", ",", False, False, True) if _c_encoder is not None else None)


def loads(text: str) -> Any:
    """One message (a line without its newline) as Python data."""
    if _scan is not None:
        try:
            value, end = _scan(text, 0)
        except StopIteration:
            value, end = None, -1
        if end == len(text):
            return value
    return json.loads(text)


def dumps(message: Any) -> str:
    """One message as compact JSON (no newline)."""
    if _encode_c is not None:
        return "".join(_encode_c(message, 0))
    return json.dumps(message, separators=(",", ":"))


PROTOCOL_VERSION = 3  # 2: a job status leaves out the fields at their STATUS_DEFAULTS
# 3: a job status may carry sandbox_stopping, cpu_seconds and memory_peak_bytes

# --- operations -----------------------------------------------------------------------------
HELLO, START, WAIT, KILL, RELEASE, SHUTDOWN = "hello", "start", "wait", "kill", "release", "shutdown"
GREP = "grep"  # a file operation, searched in a killable child process
# Interactive processes (``pty_ops.py``)
PTY_START, PTY_WRITE, PTY_READ = "pty_start", "pty_write", "pty_read"
PTY_RESIZE, PTY_TERMINATE, PTY_LIST = "pty_resize", "pty_terminate", "pty_list"
# The other file operations: the keys of ops.FILE_OPS.
OUTPUT_EVENT = "output"
# Egress (``tunnel.py``): the agent listens for the commands' proxy; each connection is a stream
# of TUNNEL frames both ways — host → agent as ``op`` with id 0 and no answer, agent → host as
# an ``ev``.
EGRESS_LISTEN, TUNNEL = "egress_listen", "tun"
TUNNEL_EVENT = TUNNEL
# Egress's data is not JSON: binary frames between the lines (``frames.py``). Exposed ports'
# data is still base64 in lines of a fixed shape, written and read by hand (no JSON codec).
TO_AGENT = b'{"id":0,"op":"tun","c":'
TO_HOST = b'{"ev":"tun","c":'
_DATA = b',"d":"'
# Exposed ports (``ports.py``): the other way round — the host accepts a connection on its own
# listener and asks the agent to connect to 127.0.0.1:PORT inside; the stream is framed like
# egress's, under its own op and event, so a frame of one kind is never taken for the other.
# Every frame starts with the prefix (host → agent: ``{"id":0,"op":"xp","c":N,…}``, the open
# ``"o":"open","port":P``; agent → host: ``{"ev":"xp","c":N,…}``).
EXPOSE = "xp"
EXPOSE_TO_AGENT = b'{"id":0,"op":"xp","c":'
EXPOSE_TO_HOST = b'{"ev":"xp","c":'


def tunnel_data(prefix: bytes, number: int, data: bytes) -> bytes:
    """One data frame, its line end included."""
    return b"%s%d%s%s\"}\n" % (prefix, number, _DATA, base64.b64encode(data))


def tunnel_number(line: bytes, prefix: bytes) -> tuple[int, bool] | None:
    """A tunnel frame's connection number and whether it is a data frame; None for a line
    that is not a tunnel frame in ``prefix``'s direction."""
    if not line.startswith(prefix):
        return None
    end = line.find(b",", len(prefix))
    try:
        number = int(line[len(prefix):end])
    except ValueError:
        return None
    return number, line.startswith(_DATA, end)


def tunnel_payload(line: bytes) -> bytes:
    """The bytes a data frame (a line without its line end) carries."""
    start = line.index(_DATA) + len(_DATA)
    return base64.b64decode(line[start:line.rindex(b'"')])


# --- error kinds: the one table (the host maps each to a seam exception in _channel.py) -------
class ErrorKind:
    FS = "fs"  # a file operation failed for a reason the model can act on: code, path, detail
    SPAWN = "spawn"  # the command could not be started: errno, in_cwd
    UNKNOWN_JOB = "unknown_job"  # no such job id
    CLOSING = "closing"  # the agent is shutting down
    PROTOCOL = "protocol"  # a malformed request: the host's bug
    AGENT = "agent"  # the agent's own fault (an exception it did not expect)
    ATTACH = "attach"  # a durable session refused an attach, or lost an answer: reason
    LIMIT = "limit"  # a session limit reached (interactive processes, their waiting input)
    PTY_EXITED = "pty_exited"  # an interactive process ended: its input is not read


ERROR_KINDS = (ErrorKind.FS, ErrorKind.SPAWN, ErrorKind.UNKNOWN_JOB, ErrorKind.CLOSING,
               ErrorKind.PROTOCOL, ErrorKind.AGENT, ErrorKind.ATTACH, ErrorKind.LIMIT,
               ErrorKind.PTY_EXITED)


# --- the messages ----------------------------------------------------------------------------
class Spec(TypedDict, total=False):
    """What ``start`` runs: a ``SpawnRequest`` less the job id, its environment sent once."""

    argv: list[str]
    cwd: str
    env: dict[str, str]  # sent with a new env_id; later specs name the id alone
    env_id: int
    deadline_ms: int | None
    grace_ms: int
    stream: bool
    output_limit: int
    # a raw exec's (spawn_as.py): stdin from this sandbox file, unlinked once the job has it;
    # the user to run as (name or uid); the variables the caller set, which a user's
    # passwd HOME/USER/LOGNAME do not replace
    stdin_file: str
    user: str
    env_given: list[str]
    keep_detached: bool  # what the command leaves running outlives it (jobs.py)


class Request(TypedDict, total=False):
    id: int
    op: str
    args: dict[str, Any]  # a file operation's arguments
    job: str  # start, wait, kill, release
    spec: Spec  # start
    wait_ms: int | None  # start, wait
    forget: bool  # start


class ErrorBody(TypedDict, total=False):
    kind: str  # one of ERROR_KINDS
    message: str
    code: str  # fs: the FsError code (errors.py)
    path: str  # fs
    detail: str  # fs
    errno: int  # spawn
    in_cwd: bool  # spawn: the working directory is what failed


class Answer(TypedDict, total=False):
    id: Any
    ok: bool
    result: dict[str, Any]  # when ok
    error: ErrorBody  # when not ok


class OutputEvent(TypedDict):
    ev: Literal["output"]
    job: str
    stream: str  # "stdout" | "stderr"
    data: str


# A job status (``jobs.Job.status``) leaves out every field at its value here, and the host
# puts them back (``channel.job_status``): most commands end with exit 0, no output and nothing
# killed, and a short answer is less to build, encode and parse at both ends of every call.
# Always present: job, pid, state, started, duration_ms.
STATUS_DEFAULTS: dict[str, Any] = {
    "exit_code": None, "timed_out": False, "killed": False, "killed_tree": None,
    "leftovers_killed": 0, "oom_killed": False, "chunks": (), "stdout_bytes": 0,
    "stderr_bytes": 0, "stdout_truncated": False, "stderr_truncated": False, "stdout_lines": 0,
    "stderr_lines": 0, "sandbox_stopping": False, "cpu_seconds": None,
    "memory_peak_bytes": None}


def answer(rid: Any, result: dict[str, Any]) -> Answer:
    return {"id": rid, "ok": True, "result": result}


def failure(rid: Any, kind: str, message: str, **extra: Any) -> Answer:
    return {"id": rid, "ok": False, "error": error(kind, message, **extra)}


def error(kind: str, message: str, **extra: Any) -> ErrorBody:
    body: ErrorBody = {"kind": kind, "message": message}
    body.update(extra)  # type: ignore[typeddict-item]
    return body


def output_event(job: str, stream: str, data: str) -> OutputEvent:
    return {"ev": "output", "job": job, "stream": stream, "data": data}
