"""``toolseam serve --stdio``: ONE session for the life of the process, driven by JSON lines.

In (one JSON object per line):
  {"id": ID, "tool": NAME, "args": {...}}         a tool call; calls may overlap
  {"op": "end_turn"}                              un-kept jobs die, the shell pin is released
  {"op": "pin_shell"}                             pin the shell for this turn
  {"op": "user_message", "text": "..."}           a USER message (widens the read scope)
  {"op": "answer", "qid": Q, "answer": A}         answer to an "ask" (once|directory|session|deny)
  {"op": "close"}                                 cancel running calls, close, exit
  EOF                                             finish the calls already read, close, exit
Out:
  {"id": ID, "result": {"output", "is_error", "metadata"[, "parts"]}}
  {"id": ID, "error": {"code", "message"}}        a host error (bad request, unknown tool …)
  {"op": "output", "id": ID, "stream": S, "data": TEXT}   with --stream, in arrival order
  {"op": "ask", "qid": Q, "path", "workdir", "tool", "choices": {...}}   with --approvals
  {"op": "end_turn", "killed_jobs": [...]}, {"op": "pinned", "shell": ...}, {"op": "closed"}
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
from typing import Any

from .builtins import OutputEvent
from .policy.readscope import ANSWERS, Answer, ReadQuestion
from .seam.errors import HostError
from .toolkit import Toolkit


class StdioServer:
    def __init__(self, toolkit: Toolkit, stream: bool, approvals: bool) -> None:
        self.toolkit = toolkit
        self.stream = stream
        self._questions: dict[str, asyncio.Future[Answer]] = {}
        self._qids = itertools.count(1)
        self._calls: dict[asyncio.Task[None], Any] = {}  # running call -> its request id
        if approvals:
            toolkit.approver = self._ask
        self._out = sys.stdout.buffer

    def send(self, message: dict[str, Any]) -> None:
        self._out.write(json.dumps(message, ensure_ascii=False).encode("utf-8", "surrogatepass")
                        + b"\n")
        self._out.flush()

    async def _ask(self, question: ReadQuestion) -> Answer:
        qid = str(next(self._qids))
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._questions[qid] = future
        self.send({"op": "ask", "qid": qid, "tool": question.tool, "path": question.path,
                   "workdir": question.workdir, "choices": question.choices})
        try:
            return await future
        finally:
            self._questions.pop(qid, None)

    async def _call(self, request_id: Any, tool: str, args: Any) -> None:
        on_output = None
        if self.stream:
            def on_output(event: OutputEvent) -> None:
                self.send({"op": "output", "id": request_id, "stream": event.stream,
                           "data": event.text})
        try:
            result = await self.toolkit.call(tool, args, call_id=str(request_id), on_output=on_output)
        except HostError as exc:
            self.send({"id": request_id, "error": {"code": exc.code, "message": str(exc)}})
            return
        self.send({"id": request_id, "result": result.to_json()})

    def _bad(self, message: str, request_id: Any = None) -> None:
        self.send({"id": request_id, "error": {"code": "BAD_REQUEST", "message": message}})

    async def _control(self, message: dict[str, Any]) -> bool:
        """Handle an op line; False when the session should close."""
        op = message.get("op")
        if op == "close":
            return False
        if op == "end_turn":
            self.send({"op": "end_turn", "killed_jobs": await self.toolkit.end_turn()})
        elif op == "pin_shell":
            self.send({"op": "pinned", "shell": (await self.toolkit.pin_shell()).label})
        elif op == "user_message" and isinstance(message.get("text"), str):
            self.toolkit.user_message(message["text"])
        elif op == "answer":
            future = self._questions.get(str(message.get("qid")))
            answer = message.get("answer")
            if future is None or future.done():
                self._bad(f"no open question {message.get('qid')!r}")
            elif answer not in ANSWERS:
                self._bad(f"answer must be one of {', '.join(ANSWERS)}, got {answer!r}")
            else:
                future.set_result(answer)
        else:
            self._bad(f"unknown or malformed op line: {json.dumps(message)[:200]}")
        return True

    async def _handle(self, line: bytes) -> bool:
        try:
            message = json.loads(line)
        except ValueError as exc:
            self._bad(f"not JSON: {exc}")
            return True
        if not isinstance(message, dict):
            self._bad("each line must be a JSON object")
            return True
        if "op" in message:
            return await self._control(message)
        if "id" not in message or not isinstance(message.get("tool"), str):
            self._bad("a call needs \"id\" and \"tool\"", message.get("id"))
            return True
        task = asyncio.ensure_future(self._call(message["id"], message["tool"], message.get("args", {})))
        self._calls[task] = message["id"]
        task.add_done_callback(lambda done: self._calls.pop(done, None))
        return True

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 30)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        closed_by_request = False
        try:
            await self.toolkit.open()
            while line := await reader.readline():
                if line.strip() and not await self._handle(line):
                    closed_by_request = True
                    break
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
            await self.toolkit.close()
            self.send({"op": "closed"})
