"""``toolseam serve --stdio``: ONE session for the life of the process, driven by JSON lines.

In (one JSON object per line):
  {"id": ID, "tool": NAME, "args": {...}}         a tool call; calls may overlap
  {"op": "end_turn"}                              un-kept jobs die, the shell pin is released
  {"op": "pin_shell"}                             pin the shell for this turn
  {"op": "user_message", "text": "..."}           a USER message (widens the read scope)
  {"op": "answer", "qid": Q, "answer": A}         answer to an "ask" (once|directory|session|deny)
  {"op": "snapshot", "label"?: L}                 keep the session's files (docs/branching.md)
  {"op": "restore", "snapshot": ID}               make them exactly a snapshot's
  {"op": "close"}                                 cancel running calls, close, exit
  EOF                                             finish the calls already read, close, exit
Out:
  {"id": ID, "result": {"output", "is_error", "metadata"[, "parts"], "model_text"}}
  {"id": ID, "error": {"code", "message"}}        a host error (bad request, unknown tool …)
  {"op": "output", "id": ID, "stream": S, "data": TEXT}   with --stream, in arrival order
  {"op": "ask", "qid": Q, "path", "workdir", "tool", "choices": {...}}   with --approvals
  {"op": "egress", "host", "port", "allowed", "reason", "status", ...}   network egress: each
                                                  connection attempt, as it ends
  {"op": "end_turn", "killed_jobs": [...]}, {"op": "pinned", "shell": ...}, {"op": "noted"},
  {"op": "answered", "qid": Q}, {"op": "snapshot", "snapshot": {...}},
  {"op": "restored", "result": {...}}, {"op": "closed"}

Every non-blank line read gets exactly one answer, whatever it holds (docs/stdio-protocol.md):
a line is read with a bounded reader and refused unparsed above ``input_limits.line_bytes``
(the rest of it skipped as it arrives, never held beyond the limit), its nesting is measured by a scan before
``json.loads`` ever recurses, and every line written is strict JSON in valid UTF-8.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
from typing import TYPE_CHECKING, Any

from .. import stdio_wire
from ..backends.agentlink.channel import REQUEST_SENT
from ..builtins import OutputEvent
from ..policy.readscope import ANSWERS, Answer, ReadQuestion
from ..seam.errors import CouldNotRunError, HostError, SessionClosedError
from ..session.toolkit import Toolkit
from .stdin_stream import connect_stdin

if TYPE_CHECKING:
    from ..egress.audit import EgressEvent

MAX_ID_CHARS = 1024
MAX_ID_INT = 2**63 - 1  # what every client language holds in a 64-bit integer


def _id_problem(request_id: Any) -> str | None:
    """Ids are strings or integers: anything else (null, bool, float, object) is refused."""
    if isinstance(request_id, str):
        return None if len(request_id) <= MAX_ID_CHARS else (
            f"an id string is at most {MAX_ID_CHARS} characters")
    if isinstance(request_id, int) and not isinstance(request_id, bool):
        return None if -MAX_ID_INT - 1 <= request_id <= MAX_ID_INT else (
            "an integer id must fit in 64 bits")
    return f"an id must be a string or an integer, got {json.dumps(request_id)[:40]}"


def _key(request_id: Any) -> tuple[bool, str | int]:
    return isinstance(request_id, str), request_id  # 1 and "1" are two ids


class StdioServer:
    def __init__(self, toolkit: Toolkit, stream: bool, approvals: bool,
                 detach_on_eof: bool = False) -> None:
        self.toolkit = toolkit
        self.stream = stream
        self.detach_on_eof = detach_on_eof  # EOF detaches (docs/sessions.md) instead of closing
        self._detaching = False
        self._questions: dict[str, asyncio.Future[Answer]] = {}
        self._qids = itertools.count(1)
        self._calls: dict[asyncio.Task[None], Any] = {}  # running call -> its request id
        self._in_flight: set[tuple[bool, str | int]] = set()
        self._input_ended = False  # EOF: a question asked from now on is answered "deny"
        self._started: dict[asyncio.Task[None], asyncio.Event] = {}  # its command reached the agent
        if approvals:
            toolkit.approver = self._ask
        self._out = sys.stdout.buffer
        self.limits = toolkit.settings.input_limits
        toolkit.on_egress = self._egress

    def _egress(self, event: EgressEvent) -> None:
        """Egress mode: each connection attempt, as its connection ends."""
        from ..egress.session import event_record  # loaded only in egress mode

        self.send({"op": "egress", **event_record(event)})

    def send(self, message: dict[str, Any]) -> None:
        self._out.write(stdio_wire.dumps(message))
        self._out.flush()

    async def _ask(self, question: ReadQuestion) -> Answer:
        if self._input_ended:  # nobody is left to answer: the read is refused, and says so
            return "deny"
        qid = str(next(self._qids))
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._questions[qid] = future
        self.send({"op": "ask", "qid": qid, "tool": question.tool, "path": question.path,
                   "workdir": question.workdir, "choices": question.choices})
        try:
            return await future
        finally:
            self._questions.pop(qid, None)

    async def _call(self, request_id: Any, tool: str, args: Any, started: asyncio.Event) -> None:
        """One call; ``started`` is set once its command reached the sandbox's agent."""
        on_output = None
        if self.stream:
            def on_output(event: OutputEvent) -> None:
                self.send({"op": "output", "id": request_id, "stream": event.stream,
                           "data": event.text})
        REQUEST_SENT.set(lambda op: started.set() if op == "start" else None)
        try:
            result = await self.toolkit.call(tool, args, call_id=str(request_id), on_output=on_output)
            if self._detaching and result.metadata.get("failure") == "could_not_run":
                raise SessionClosedError("detached")  # cut by the detach, not a sandbox fault
        except HostError as exc:
            if self._detaching:
                self.send({"id": request_id, "error": self._detached_error(started.is_set())})
                return
            self.send({"id": request_id, "error": {"code": exc.code, "message": str(exc)}})
            return
        except Exception as exc:  # noqa: BLE001 - a fault of ours still answers the call
            self.send({"id": request_id, "error": {"code": "INTERNAL",
                                                   "message": f"{type(exc).__name__}: {exc}"}})
            return
        self.send({"id": request_id,
                   "result": {**result.to_json(), "model_text": result.model_text()}})

    def _detached_error(self, started: bool) -> dict[str, str]:
        """What a call cut by ``--detach-on-eof`` answers: true to what happened to it."""
        if not started:
            return {"code": "NOT_RUN", "message": "the session was detached before this call "
                    "reached the sandbox: nothing of it ran; send it again after attaching"}
        if self.toolkit.settings.timeout_policy == "detach":
            how = ("attach, then list it with bash {\"jobs\": true} and fetch its output with "
                   "bash {\"wait\": ID}")
        else:
            how = ("its output cannot be fetched under timeout_policy \"kill\" (the job forms "
                   "need \"detach\"); it ends when it ends, or with the session")
        return {"code": "DETACHED", "message": "the session was detached while this call's "
                f"command ran; the command goes on in the sandbox: {how}"}

    def _bad(self, message: str, request_id: Any = None) -> None:
        self.send({"id": request_id, "error": {"code": "BAD_REQUEST", "message": message}})

    async def _control(self, message: dict[str, Any]) -> bool:
        """Handle an op line; False when the session should close."""
        op = message.get("op")
        if op == "close":
            return False
        try:
            if op == "end_turn":
                self.send({"op": "end_turn", "killed_jobs": await self.toolkit.end_turn()})
            elif op == "pin_shell":
                self.send({"op": "pinned", "shell": (await self.toolkit.pin_shell()).label})
            elif op == "user_message" and isinstance(message.get("text"), str):
                self.toolkit.user_message(message["text"])
                self.send({"op": "noted"})
            elif op == "answer":
                self._answer(message)
            elif op == "snapshot" and isinstance(message.get("label"), str | None):
                snap = await self.toolkit.snapshot(message.get("label"))
                self.send({"op": "snapshot", "snapshot": snap.model_dump(mode="json")})
            elif op == "restore" and isinstance(message.get("snapshot"), str):
                done = await self.toolkit.restore(message["snapshot"])  # ends running jobs
                self.send({"op": "restored", "result": done.model_dump()})
            else:
                self._bad(f"unknown or malformed op line: {json.dumps(message)[:200]}")
        except HostError as exc:
            self.send({"op": op, "error": {"code": exc.code, "message": str(exc)}})
        except CouldNotRunError as exc:  # e.g. a tampered snapshot, refused before any change
            self.send({"op": op, "error": {"code": "COULD_NOT_RUN", "message": exc.reason}})
        except Exception as exc:  # noqa: BLE001 - the server serves on
            self.send({"op": op, "error": {"code": "INTERNAL",
                                           "message": f"{type(exc).__name__}: {exc}"}})
        return True

    async def _detach(self) -> None:
        """EOF with ``--detach-on-eof``: every call already read first gets as far as it can —
        a question it waits on is answered ``deny`` (nobody is left to answer), and it is
        waited for until it is answered or its command has reached the sandbox's agent. Then
        the sandbox and its jobs go on; a command in flight goes on as a job the next attach
        finds, and each call answers what really happened to it (``_detached_error``)."""
        self._input_ended = True
        for future in list(self._questions.values()):
            if not future.done():
                future.set_result("deny")
        waiters = []
        for task in list(self._calls):
            started = self._started.get(task)
            if started is not None:
                waiter = asyncio.ensure_future(started.wait())
                waiters.append(waiter)
                task.add_done_callback(_cancel_when_done(waiter))  # answered: no need
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*waiters, return_exceptions=True)
        self._detaching = True
        handle = await self.toolkit.detach()
        # each call in flight fails with the channel and answers DETACHED itself
        await asyncio.gather(*self._calls, return_exceptions=True)
        self.send({"op": "detached", "handle": handle.model_dump()})

    def _answer(self, message: dict[str, Any]) -> None:
        qid = message.get("qid")
        future = self._questions.get(str(qid))
        answer = message.get("answer")
        if future is None or future.done():
            self._bad(f"no open question {json.dumps(qid)[:80]}")
        elif answer not in ANSWERS:
            self._bad(f"answer must be one of {', '.join(ANSWERS)}, got {json.dumps(answer)[:80]}")
        else:
            future.set_result(answer)
            self.send({"op": "answered", "qid": str(qid)})

    def _parse(self, line: bytes | stdio_wire.Oversized) -> dict[str, Any] | None:
        """The line as an object, or None after answering why it is refused. The limits are
        checked before parsing: the size while reading, the nesting by a scan."""
        limits = self.limits
        if isinstance(line, stdio_wire.Oversized):
            self._bad(f"line of {line.size} bytes is over the limit of {limits.line_bytes} "
                      "(input_limits.line_bytes); it was skipped unread")
            return None
        if stdio_wire.deeper_than(line, limits.json_depth):
            self._bad(f"line nests arrays/objects deeper than {limits.json_depth} "
                      "(input_limits.json_depth)")
            return None
        try:
            message = stdio_wire.loads(line)
        except RecursionError:  # the scan's backstop: never a traceback
            self._bad(f"line nests too deeply (input_limits.json_depth {limits.json_depth})")
            return None
        except ValueError as exc:  # UnicodeDecodeError included: not UTF-8 is not JSON either
            self._bad(f"not JSON: {exc}"[:500])
            return None
        if not isinstance(message, dict):
            self._bad("each line must be a JSON object")
            return None
        return message

    async def _handle(self, line: bytes | stdio_wire.Oversized) -> bool:
        message = self._parse(line)
        if message is None:
            return True
        if "op" in message:
            return await self._control(message)
        request_id = message.get("id")
        if "id" not in message or not isinstance(message.get("tool"), str):
            self._bad("a call needs \"id\" and \"tool\"",
                      request_id if _id_problem(request_id) is None else None)
            return True
        problem = _id_problem(request_id)
        if problem:
            self._bad(problem)
            return True
        key = _key(request_id)  # checked above: a str or an int
        if key in self._in_flight:  # a second answer under that id could not be told apart
            self.send({"id": request_id, "error": {
                "code": "DUPLICATE_ID", "message": f"id {json.dumps(request_id)[:80]} belongs to "
                "a call still in flight; this line was not run (that call still gets its answer)"}})
            return True
        self._in_flight.add(key)
        started = asyncio.Event()  # made now: a call read before EOF is waited for at EOF
        task = asyncio.ensure_future(self._call(request_id, message["tool"],
                                                message.get("args", {}), started))
        self._calls[task] = request_id
        self._started[task] = started

        def finished(done: asyncio.Task[None]) -> None:
            self._calls.pop(done, None)
            self._started.pop(done, None)
            self._in_flight.discard(key)

        task.add_done_callback(finished)
        return True

    async def run(self) -> None:
        reader = asyncio.StreamReader(limit=stdio_wire.CHUNK)
        await connect_stdin(reader)  # a pipe, or a file/`/dev/null` through a thread
        closed_by_request = False
        try:
            await self.toolkit.open()
            if self.toolkit.settings.orphan_timeout_s > 0:  # a supervisor stores it at once
                self.send({"op": "handle", "handle": self.toolkit.handle.model_dump()})
            async for line in stdio_wire.read_lines(reader, self.limits.line_bytes):
                if isinstance(line, bytes) and not line.strip():
                    continue  # a blank line is not a request
                if not await self._handle(line):
                    closed_by_request = True
                    break
            self._input_ended = True  # a question asked from now on could not be answered
            if not closed_by_request and self.detach_on_eof:
                await self._detach()
            if not closed_by_request:  # EOF: every call already read still gets its answer
                await asyncio.gather(*self._calls, return_exceptions=True)
        finally:
            pending = dict(self._calls)
            for task in pending:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*pending, return_exceptions=True)
            for task, request_id in pending.items():
                if task.cancelled():  # whether it had started or not, it answered nothing
                    self.send({"id": request_id,
                               "error": {"code": "CANCELLED", "message": "session closed"}})
            await self.toolkit.close()  # after a detach: nothing (the session goes on)
            if not self._detaching:
                self.send({"op": "closed"})


def _cancel_when_done(waiter: asyncio.Future[Any]) -> Any:
    def cancel(_: asyncio.Future[Any]) -> None:
        waiter.cancel()
    return cancel
