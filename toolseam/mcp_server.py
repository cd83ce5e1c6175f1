"""``toolseam mcp``: the seven builtins as an MCP server, on the official ``mcp`` SDK.

One sandbox per MCP session: made on the session's first tool request, closed when the
session ends — the client disconnects (stdio EOF), deletes its HTTP session, or the session
idles out. The 2026-07-28 protocol over HTTP has no sessions (each request stands alone): such
clients share one sandbox, closed when the server stops.

A tool failure is a result with ``isError``; a sandbox that could not run the call is an
``isError`` result naming the reason (``structuredContent`` carries the metadata,
``failure: could_not_run`` included). A command's live output arrives as progress
notifications and MCP log notifications (``logger`` ``stdout``/``stderr``). Read-scope
questions become MCP elicitation where the client declares it; otherwise the read is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import warnings
from collections.abc import Callable
from typing import Any

try:
    import mcp_types as types
    from mcp.server import Server
    from mcp.server.context import ServerRequestContext
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    from .seam.errors import BackendUnavailable

    raise BackendUnavailable(
        f"the MCP server needs the {exc.name!r} package: pip install 'toolseam[mcp]'") from None

from . import __version__
from .builtins import OutputEvent, ToolResult
from .policy.readscope import ANSWERS, Answer, ReadQuestion
from .seam.errors import HostError
from .toolkit import Toolkit

ToolkitFactory = Callable[[], Toolkit]

READ_ONLY = frozenset({"read", "grep", "glob"})
_STATE_KEY = "toolseam.toolkit"
# The request being served, for the approver (which the toolkit calls without a context), and
# the approvals its client already gave through input responses (path -> answer).
_request: contextvars.ContextVar[ServerRequestContext[Any, Any]] = contextvars.ContextVar("request")
_given: contextvars.ContextVar[dict[str, Answer]] = contextvars.ContextVar("given")
APPROVAL_KEY = "read-approval"


class _NeedsApproval(Exception):  # a signal to ask the client, not an error
    """The 2026-07-28 protocol has no server-to-client request mid-call: the call stops before
    its effect, asks through an ``InputRequiredResult``, and runs again with the answer."""

    def __init__(self, question: ReadQuestion) -> None:
        super().__init__(question.path)
        self.question = question


def _approval_request(question: ReadQuestion) -> tuple[str, dict[str, Any]]:
    schema = {"type": "object", "required": ["answer"], "properties": {"answer": {
        "type": "string", "enum": list(ANSWERS), "title": "Allow this read?",
        "description": "; ".join(f"{k}: {v}" for k, v in question.choices.items())}}}
    return f"{question.tool} wants to read {question.path}, outside {question.workdir}.", schema


def _answer(reply: Any) -> Answer:
    if not isinstance(reply, types.ElicitResult) or reply.action != "accept":
        return "deny"
    answer = (reply.content or {}).get("answer")
    for known in ANSWERS:
        if answer == known:
            return known
    return "deny"


def annotations_for(name: str) -> types.ToolAnnotations:
    read_only = name in READ_ONLY
    return types.ToolAnnotations(read_only_hint=read_only, destructive_hint=not read_only,
                                 idempotent_hint=read_only, open_world_hint=False)


def result_to_mcp(result: ToolResult) -> types.CallToolResult:
    content: list[Any] = [types.TextContent(type="text", text=result.output)]
    for part in result.parts or []:
        if part.get("type") == "image":
            content.append(types.ImageContent(type="image", data=part["data"],
                                              mime_type=part["mimeType"]))
    return types.CallToolResult(content=content, is_error=result.is_error,
                                structured_content={"metadata": result.metadata})


def _connection(ctx: ServerRequestContext[Any, Any]) -> Any:
    """The MCP session's connection: its ``state`` holds our toolkit and its ``exit_stack``
    closes it when the session ends. SDK 2.3 hands lowlevel handlers a ``ServerSession`` that
    keeps the connection private (``Context.connection`` is not built for them yet)."""
    return ctx.session._connection  # private in SDK 2.3: see the docstring


class McpTools:
    """The handlers, around a factory that makes one Toolkit per MCP session."""

    def __init__(self, factory: ToolkitFactory, approvals: bool = False) -> None:
        self.factory = factory
        self.approvals = approvals
        self._opening = asyncio.Lock()
        self.toolkits: list[Toolkit] = []  # live ones, for shutdown
        self._shared: Toolkit | None = None

    async def toolkit(self, ctx: ServerRequestContext[Any, Any]) -> Toolkit:
        connection = _connection(ctx)
        async with self._opening:
            if connection.session_id is None and ctx.request is not None:
                # A 2026-07-28 exchange over HTTP has no session: every request is a connection
                # of its own. Those clients share the server's one sandbox, closed at shutdown.
                if self._shared is None:
                    self._shared = self._new()
                return self._shared
            toolkit: Toolkit | None = connection.state.get(_STATE_KEY)
            if toolkit is None:
                toolkit = connection.state[_STATE_KEY] = self._new()
                connection.exit_stack.push_async_callback(self._close, toolkit)
        return toolkit

    def _new(self) -> Toolkit:
        toolkit = self.factory()
        toolkit.approver = self._ask if self.approvals else None
        self.toolkits.append(toolkit)
        return toolkit

    async def _close(self, toolkit: Toolkit) -> None:
        with contextlib.suppress(ValueError):
            self.toolkits.remove(toolkit)
        await toolkit.close()

    async def close_all(self) -> None:
        for toolkit in list(self.toolkits):
            await self._close(toolkit)

    async def list_tools(self, ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        toolkit = await self.toolkit(ctx)
        tools = [types.Tool(name=d["name"], description=d["description"],
                            input_schema=d["input_schema"], annotations=annotations_for(d["name"]))
                 for d in toolkit.declarations("anthropic")]
        return types.ListToolsResult(tools=tools)

    async def call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult | types.InputRequiredResult:
        toolkit = await self.toolkit(ctx)
        outbox: asyncio.Queue[OutputEvent | None] = asyncio.Queue()
        sender = asyncio.ensure_future(self._send_output(ctx, outbox))
        tokens = _request.set(ctx), _given.set(self._given_answers(params))
        try:
            result = await toolkit.call(params.name, params.arguments or {},
                                        on_output=outbox.put_nowait)
        except HostError as exc:  # an unknown tool, a closed session: the client's mistake
            result = ToolResult(output=f"{params.name}: {exc}", is_error=True,
                                metadata={"error": exc.code})
        except _NeedsApproval as needed:
            message, schema = _approval_request(needed.question)
            request = types.ElicitRequest(params=types.ElicitRequestFormParams(
                message=message, requested_schema=schema))
            return types.InputRequiredResult(input_requests={APPROVAL_KEY: request},
                                             request_state=json.dumps({"path": needed.question.path}))
        finally:
            _request.reset(tokens[0])
            _given.reset(tokens[1])
            outbox.put_nowait(None)
            await sender  # every output notification goes out before the result
        return result_to_mcp(result)

    @staticmethod
    def _given_answers(params: types.CallToolRequestParams) -> dict[str, Answer]:
        """The approval a retried call carries (``request_state`` names the path)."""
        if not params.request_state or not params.input_responses:
            return {}
        try:
            path = json.loads(params.request_state)["path"]
        except (ValueError, KeyError, TypeError):
            return {}
        reply = params.input_responses.get(APPROVAL_KEY)
        return {path: _answer(reply)} if isinstance(path, str) else {}

    @staticmethod
    async def _send_output(ctx: ServerRequestContext[Any, Any],
                           outbox: asyncio.Queue[OutputEvent | None]) -> None:
        sent = 0
        while (event := await outbox.get()) is not None:
            sent += len(event.text)
            with contextlib.suppress(Exception):  # notifications are advisory; never fail a call
                await ctx.session.report_progress(sent, message=event.text)
            # Log notifications too, for clients that opted in to them (deprecated by the
            # 2026-07-28 protocol, still what many clients show; the SDK warns about that).
            with warnings.catch_warnings(), contextlib.suppress(Exception):
                warnings.simplefilter("ignore")
                await ctx.session.send_log_message("info", event.text, logger=event.stream,
                                                   related_request_id=ctx.request_id)

    async def _ask(self, question: ReadQuestion) -> Answer:
        given = _given.get({})
        if question.path in given:
            return given.pop(question.path)
        ctx = _request.get(None)
        if ctx is None or not ctx.session.check_client_capability(
                types.ClientCapabilities(elicitation=types.ElicitationCapability())):
            return "deny"  # a client that cannot be asked: the read is refused
        if not ctx.session.can_send_request:
            raise _NeedsApproval(question)
        message, schema = _approval_request(question)
        try:
            reply = await ctx.session.elicit(message, schema, related_request_id=ctx.request_id)
        except Exception:  # noqa: BLE001 - a client that failed to answer: refuse, never hang
            return "deny"
        return _answer(reply)


def build_server(factory: ToolkitFactory, approvals: bool = False) -> tuple[Server[Any], McpTools]:
    tools = McpTools(factory, approvals)
    server: Server[Any] = Server("toolseam", version=__version__,
                                 instructions="An agent's builtin tools (bash, read, write, edit, "
                                 "apply_patch, grep, glob) in one sandboxed session.",
                                 on_list_tools=tools.list_tools, on_call_tool=tools.call_tool)
    return server, tools


async def serve_stdio(factory: ToolkitFactory, approvals: bool = False) -> None:
    from mcp.server.stdio import stdio_server

    server, tools = build_server(factory, approvals)
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await tools.close_all()


def serve_http(factory: ToolkitFactory, host: str, port: int, approvals: bool = False) -> None:
    """Streamable HTTP at ``http://HOST:PORT/mcp`` until interrupted."""
    import uvicorn

    server, tools = build_server(factory, approvals)
    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on")

    async def run() -> None:
        try:
            await uvicorn.Server(config).serve()
        finally:
            await tools.close_all()

    asyncio.run(run())
