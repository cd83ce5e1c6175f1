"""Read-scope questions over MCP, and which answers count.

A 2025-11-25 client is asked mid-call (an elicitation request). The 2026-07-28 protocol has no
server-to-client request: the call stops before its effect and returns an
``InputRequiredResult``; the client retries with its answer. An answer counts only as the
reply to a question this server put to that client's sandbox and has not had answered: each
question carries a one-use nonce kept in the sandbox, and the SDK seals ``requestState``
(bound to the tool, its arguments and a deadline). An approval a client sends unasked — or
replays — counts for nothing (decision 63).
"""

from __future__ import annotations

import contextvars
import json
import secrets
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext

from ...policy.readscope import ANSWERS, Answer, ReadQuestion
from .sandboxes import Sandbox

APPROVAL_KEY = "read-approval"
SANDBOX_ARG = "sandbox"
MOST_PENDING_QUESTIONS = 16  # per sandbox; the oldest unanswered question is forgotten first
# The request being served, for the approver (which the toolkit calls without a context), and
# the answers its client gave to this server's questions (path -> answer).
request: contextvars.ContextVar[ServerRequestContext[Any, Any]] = contextvars.ContextVar("request")
given: contextvars.ContextVar[dict[str, Answer]] = contextvars.ContextVar("given")


class NeedsApproval(Exception):  # a signal to ask the client, not an error
    """Raised by the approver where the client can only be asked by an input-required result."""

    def __init__(self, question: ReadQuestion) -> None:
        super().__init__(question.path)
        self.question = question


def approval_request(question: ReadQuestion) -> tuple[str, dict[str, Any]]:
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {
        "type": "string", "enum": list(ANSWERS), "title": "Allow this read?",
        "description": "; ".join(f"{k}: {v}" for k, v in question.choices.items())}}}
    return f"{question.tool} wants to read {question.path}, outside {question.workdir}.", schema


def answer_of(reply: Any) -> Answer:
    if not isinstance(reply, types.ElicitResult) or reply.action != "accept":
        return "deny"
    answer = (reply.content or {}).get("answer")
    for known in ANSWERS:
        if answer == known:
            return known
    return "deny"


def request_state(params: types.CallToolRequestParams) -> dict[str, Any]:
    """What this server put in ``requestState`` (the SDK has verified its seal)."""
    if not params.request_state:
        return {}
    try:
        state = json.loads(params.request_state)
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}


def input_required(sandbox: Sandbox, question: ReadQuestion) -> types.InputRequiredResult:
    """Ask this client; remember the question so only its answer counts, once."""
    while len(sandbox.asked) >= MOST_PENDING_QUESTIONS:
        del sandbox.asked[next(iter(sandbox.asked))]
    nonce = secrets.token_urlsafe(16)
    sandbox.asked[nonce] = question.path
    message, schema = approval_request(question)
    ask = types.ElicitRequest(params=types.ElicitRequestFormParams(
        message=message, requested_schema=schema))
    state = {"path": question.path, "nonce": nonce, SANDBOX_ARG: sandbox.handle}
    return types.InputRequiredResult(input_requests={APPROVAL_KEY: ask},
                                     request_state=json.dumps(state))


def given_answers(sandbox: Sandbox, params: types.CallToolRequestParams,
                  state: dict[str, Any]) -> dict[str, Answer]:
    """The answer a retried call carries — only to a question this sandbox asked and has not
    had answered yet."""
    nonce, path = state.get("nonce"), state.get("path")
    if not isinstance(nonce, str) or not isinstance(path, str):
        return {}
    if sandbox.asked.get(nonce) != path:
        return {}
    del sandbox.asked[nonce]
    return {path: answer_of((params.input_responses or {}).get(APPROVAL_KEY))}


async def ask(question: ReadQuestion) -> Answer:
    """The toolkit's approver: an answer given in this call, else ask the client."""
    answers = given.get({})
    if question.path in answers:
        return answers.pop(question.path)
    ctx = request.get(None)
    if ctx is None or not ctx.session.check_client_capability(
            types.ClientCapabilities(elicitation=types.ElicitationCapability())):
        return "deny"  # a client that cannot be asked: the read is refused
    if not ctx.session.can_send_request:
        raise NeedsApproval(question)
    message, schema = approval_request(question)
    try:
        reply = await ctx.session.elicit(message, schema, related_request_id=ctx.request_id)
    except Exception:  # noqa: BLE001 - a client that failed to answer: refuse, never hang
        return "deny"
    return answer_of(reply)
