"""``toolseam mcp``: the seven builtins as an MCP server, on the official ``mcp`` SDK.

Clients never share a sandbox unless the operator asks for it (``shared``): a session (stdio,
or a 2025-11-25 HTTP session) owns one, made on its first tool call and closed when the session
ends; a 2026-07-28 client over HTTP has no session, so the server mints a sandbox *handle* on
its first call, which the client passes back as the ``sandbox`` argument (``mcp_sandboxes``).

A tool failure is a result with ``isError``; a sandbox that could not run the call is an
``isError`` result naming the reason (``structuredContent`` carries the metadata,
``failure: could_not_run`` included). A command's live output arrives as progress
notifications and MCP log notifications (``logger`` ``stdout``/``stderr``, level ``info``, as
the client's ``logging/setLevel`` or per-request opt-in allows). Read-scope questions become
MCP elicitation where the client declares it; otherwise the read is refused. An approval
counts only as the answer to a question this server put to this client's sandbox: each question
carries a one-use nonce, and the SDK seals ``requestState`` (decision 63).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...backends import backend_kind

try:
    import mcp_types as types
    from mcp.server import Server
    from mcp.server.context import ServerRequestContext
    from mcp.server.request_state import RequestStateBoundary, RequestStateSecurity
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    from ..._extras import install_hint
    from ...seam.errors import BackendUnavailable

    raise BackendUnavailable(
        f"the MCP server needs the {exc.name!r} package: {install_hint('mcp')}") from None

from ... import __version__
from ...builtins import OutputEvent, ToolResult
from ...observability.config import share_with_libraries
from ...policy.readscope import Answer
from ...seam.errors import HostError
from ...session.toolkit import Toolkit
from . import approvals
from . import branching as branches
from .approvals import SANDBOX_ARG
from .sandboxes import LOCAL, NEW, Handles, Sandbox, SandboxRefused

if TYPE_CHECKING:
    from ...egress.audit import EgressEvent

ToolkitFactory = Callable[[], Toolkit]

READ_ONLY = frozenset({"read", "grep", "glob"})
_STATE_KEY = "toolseam.sandbox"
_LOG_LEVEL_KEY = "toolseam.log_level"
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


def annotations_for(name: str) -> types.ToolAnnotations:
    read_only = name in READ_ONLY
    return types.ToolAnnotations(read_only_hint=read_only, destructive_hint=not read_only,
                                 idempotent_hint=read_only, open_world_hint=False)


def result_to_mcp(result: ToolResult) -> types.CallToolResult:
    content: list[Any] = [types.TextContent(type="text", text=result.model_text())]
    for part in result.parts or []:
        if part.get("type") == "image":
            content.append(types.ImageContent(type="image", data=part["data"],
                                              mime_type=part["mimeType"]))
    return types.CallToolResult(content=content, is_error=result.is_error,
                                structured_content={"metadata": result.metadata})


def describe(toolkit: Toolkit, shared: bool = False, handles: bool = False,
             branching: bool = False) -> str:
    """What the sandbox is, said plainly to the model (the server's instructions)."""
    tools = "The builtin tools of a coding agent (bash, read, write, edit, apply_patch, grep, glob). "
    if branching:
        tools += ("snapshot, restore and fork keep a sandbox's files, put them back, and open "
                  "new sandboxes from them (addressed by the handles fork returns). ")
    kind = backend_kind(toolkit.backend.name)
    contained = kind.contained
    noun = "sandbox" if contained else "session"  # the host sandboxes nothing
    whose = (f"one {noun} (jobs, read approvals) shared by every client of this server" if shared
             else f"a {noun} of your own (jobs, read approvals)")
    if handles:  # sessionless clients: the principal's default, and more on request
        whose = (f"a {noun} of your own per client session (jobs, read approvals); without a "
                 f"session, calls without \"sandbox\" use your default {noun} (one per bearer "
                 f"token, or one for this server without a token), and \"sandbox\": \"{NEW}\" "
                 "opens another, whose handle the result names: pass it as \"sandbox\" to keep "
                 "using that one")
    if not contained:
        where = ("They run on the host backend: commands run directly on this machine as the user "
                 "running the server, with everything that user can reach (files, network, "
                 "processes); there is no container. ")
        paths = ("Only the file tools are confined to the base directory; bash is not."
                 if toolkit.confine else "Paths are not confined to the base directory.")
        return f"{tools}{where}{paths} You get {whose}."
    return (f"{tools}They run in {kind.where}: {whose}; commands reach only what the sandbox "
            "holds (its workspace, and the network if enabled).")


_HOST_BASH_NOTE = (" On this server bash runs directly on the host machine as the server's user, "
                   "not in a container.")
_SANDBOX_SCHEMA = {"type": "string", "description": (
    "Omit it to use your default sandbox (its files, /tmp and jobs stay between calls). "
    f"\"{NEW}\" opens another sandbox; its result names the handle (also in "
    "structuredContent.sandbox): pass that handle to keep using that sandbox.")}
_BRANCH_SCHEMA = {"type": "string", "description": (
    "Omit it to use your own sandbox. A handle a fork result gave works in that forked "
    f"sandbox; \"{NEW}\" opens another sandbox, whose handle the result names.")}
_FORKS_SCHEMA = {"type": "string", "description": (  # sessionless clients, with --branching
    f"{_SANDBOX_SCHEMA['description']} A handle a fork result gave works in that forked sandbox.")}


def _connection(ctx: ServerRequestContext[Any, Any]) -> Any:
    """The MCP session's connection: its ``state`` holds our sandbox and its ``exit_stack``
    closes it when the session ends. SDK 2.3 hands lowlevel handlers a ``ServerSession`` that
    keeps the connection private (``Context.connection`` is not built for them yet)."""
    return ctx.session._connection  # private in SDK 2.3: see the docstring


def _principal() -> str:
    """Whose request this is: its bearer token's principal, or the one local principal of a
    unix-socket server without a token (its mode 0600 the check)."""
    from mcp.server.auth.middleware.auth_context import get_access_token

    token = get_access_token()
    return token.client_id if token is not None and token.client_id else LOCAL


def _sessionless(ctx: ServerRequestContext[Any, Any]) -> bool:
    """A 2026-07-28 exchange over HTTP: every request is a connection of its own."""
    return _connection(ctx).session_id is None and ctx.request is not None


class McpTools:
    """The handlers, around a factory that makes one Toolkit per sandbox."""

    def __init__(self, factory: ToolkitFactory, approvals: bool = False,
                 shared: bool = False, one_client: bool = False, branching: bool = False) -> None:
        self.factory = factory
        self.approvals = approvals
        # snapshot, restore, fork: off unless asked for (--branching, decision 430)
        self.branching = branches.Branching(self._admit) if branching else None
        # One sandbox for the server: asked for (shared), or stdio, whose one client may speak
        # 2026-07-28, where the SDK makes a new connection for every request.
        self.single = shared or one_client
        self.probe = factory()  # for declarations and the description; never opened
        self.handles = Handles(self._new)
        self._opening = asyncio.Lock()
        self.toolkits: list[Toolkit] = []  # live ones, for shutdown
        self._shared: Sandbox | None = None
        self._closing: set[asyncio.Future[None]] = set()  # evictions under way

    async def sandbox(self, ctx: ServerRequestContext[Any, Any], arguments: dict[str, Any],
                      state: dict[str, Any]) -> Sandbox:
        """The caller's sandbox; ``arguments`` loses the ``sandbox`` handle. Raises
        ``SandboxRefused`` for a handle that names no open sandbox."""
        async with self._opening:
            if self.branching is not None and arguments.get(SANDBOX_ARG) is not None:
                return self._sessionless_sandbox(arguments, state)  # a fork's child, in any mode
            if self.single:
                if self._shared is None:
                    self._shared = Sandbox(self._new())
                return self._shared
            if _sessionless(ctx):
                return self._sessionless_sandbox(arguments, state)
            connection = _connection(ctx)
            sandbox: Sandbox | None = connection.state.get(_STATE_KEY)
            if sandbox is None:
                sandbox = connection.state[_STATE_KEY] = Sandbox(self._new())
                connection.exit_stack.push_async_callback(self._close, sandbox.toolkit)
        return sandbox

    def _sessionless_sandbox(self, arguments: dict[str, Any], state: dict[str, Any]) -> Sandbox:
        """The principal's default sandbox, the one a handle names, or a new one ("new")."""
        principal = _principal()
        handle = arguments.pop(SANDBOX_ARG, None) or state.get(SANDBOX_ARG)
        if handle is None:
            return self.handles.default(principal)
        if not isinstance(handle, str):
            raise SandboxRefused(f"\"sandbox\" must be the handle string a result gave or \"{NEW}\"")
        if handle != NEW:
            return self.handles.get(handle, principal)
        sandbox, evicted = self.handles.mint(principal)
        self._evict(evicted)
        return sandbox

    async def _admit(self, toolkit: Toolkit, principal: str) -> Sandbox:
        """A fork's child, as a handle sandbox of the principal that forked it."""
        sandbox, evicted = self.handles.mint(principal, toolkit)
        toolkit.approver = approvals.ask if self.approvals else None
        self.toolkits.append(toolkit)
        sandbox.announced = True  # the fork's result names its handle
        self._evict(evicted)
        return sandbox

    def _evict(self, evicted: list[Sandbox]) -> None:
        for old in evicted:  # its own least recently used, to make room
            with contextlib.suppress(ValueError):
                self.toolkits.remove(old.toolkit)  # close_all leaves it to this close
            closing = asyncio.ensure_future(self._close(old.toolkit))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def _new(self) -> Toolkit:
        toolkit = self.factory()
        toolkit.approver = approvals.ask if self.approvals else None
        self.toolkits.append(toolkit)
        return toolkit

    async def _close(self, toolkit: Toolkit) -> None:
        with contextlib.suppress(ValueError):
            self.toolkits.remove(toolkit)
        try:
            await toolkit.close()
        except Exception as exc:  # noqa: BLE001 - one failed close must not leave others open
            # e.g. a copy-back that could not come home: the message says where the work is
            print(f"toolseam mcp: closing a sandbox: {exc}", file=sys.stderr, flush=True)

    async def close_idle(self) -> None:
        for sandbox in self.handles.take_idle():
            await self._close(sandbox.toolkit)

    async def close_all(self) -> None:
        self.handles.take_all()
        await asyncio.gather(*self._closing, return_exceptions=True)
        for toolkit in list(self.toolkits):
            await self._close(toolkit)

    async def list_tools(self, ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        handles = not self.single and _sessionless(ctx)
        on_host = not backend_kind(self.probe.backend.name).contained
        declarations = self.probe.declarations("anthropic")
        if self.branching is not None:
            declarations = [*declarations, *branches.DECLARATIONS]
        argument = (_SANDBOX_SCHEMA if self.branching is None
                    else _FORKS_SCHEMA if handles else _BRANCH_SCHEMA)
        tools = []
        for declared in declarations:
            schema = declared["input_schema"]
            if handles or self.branching is not None:
                schema = {**schema, "properties": {**schema.get("properties", {}),
                                                   SANDBOX_ARG: argument}}
            description = declared["description"]
            if on_host and declared["name"] == "bash":
                description += _HOST_BASH_NOTE
            hints = (types.ToolAnnotations(**branches.hints(declared["name"]))
                     if declared["name"] in branches.NAMES else annotations_for(declared["name"]))
            tools.append(types.Tool(name=declared["name"], description=description,
                                    input_schema=schema, annotations=hints))
        return types.ListToolsResult(tools=tools)

    async def set_logging_level(self, ctx: ServerRequestContext[Any, Any],
                                params: types.SetLevelRequestParams) -> types.EmptyResult:
        _connection(ctx).state[_LOG_LEVEL_KEY] = params.level
        return types.EmptyResult()

    async def call_tool(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
                        ) -> types.CallToolResult | types.InputRequiredResult:
        arguments = dict(params.arguments or {})
        state = approvals.request_state(params)
        if params.name in branches.NAMES and self.branching is None:  # before any sandbox opens
            return result_to_mcp(ToolResult(output=branches.OFF.format(name=params.name),
                                            is_error=True, metadata={"error": "UNKNOWN_TOOL"}))
        try:
            sandbox = await self.sandbox(ctx, arguments, state)
        except SandboxRefused as exc:
            return result_to_mcp(ToolResult(output=f"{params.name}: {exc}", is_error=True,
                                            metadata={"error": exc.code}))
        sandbox.busy += 1
        try:
            if params.name in branches.NAMES and self.branching is not None:
                result: ToolResult | types.InputRequiredResult = await self.branching.call(
                    params.name, arguments, sandbox, _principal())
            else:
                result = await self._run(ctx, params.name, arguments, sandbox,
                                         approvals.given_answers(sandbox, params, state))
        finally:
            sandbox.busy -= 1
            sandbox.last_used = time.monotonic()
        if isinstance(result, types.InputRequiredResult):
            return result
        return self._with_handle(result_to_mcp(result), sandbox)

    async def _run(self, ctx: ServerRequestContext[Any, Any], name: str, arguments: dict[str, Any],
                   sandbox: Sandbox, given: dict[str, Answer]
                   ) -> ToolResult | types.InputRequiredResult:
        outbox: asyncio.Queue[OutputEvent | EgressEvent | None] = asyncio.Queue()
        sender = asyncio.ensure_future(self._send_output(ctx, outbox))
        tokens = approvals.request.set(ctx), approvals.given.set(given)
        # Egress mode: the connections that end during this call go out as log notifications
        # on it (with concurrent calls on one sandbox, on the latest of them).
        sandbox.toolkit.on_egress = outbox.put_nowait
        try:
            return await sandbox.toolkit.call(name, arguments, on_output=outbox.put_nowait)
        except HostError as exc:  # an unknown tool, a closed session: the client's mistake
            return ToolResult(output=f"{name}: {exc}", is_error=True, metadata={"error": exc.code})
        except approvals.NeedsApproval as needed:
            return approvals.input_required(sandbox, needed.question)
        finally:
            approvals.request.reset(tokens[0])
            approvals.given.reset(tokens[1])
            outbox.put_nowait(None)
            await sender  # every output notification goes out before the result

    @staticmethod
    def _with_handle(result: types.CallToolResult, sandbox: Sandbox) -> types.CallToolResult:
        """A handle sandbox's results carry its handle; the first says what it is for."""
        if sandbox.handle is None:
            return result
        structured = {**(result.structured_content or {}), SANDBOX_ARG: sandbox.handle}
        content = list(result.content)
        if not sandbox.announced:
            sandbox.announced = True
            content.append(types.TextContent(type="text", text=(
                f"[This call opened sandbox {sandbox.handle}. Pass \"{SANDBOX_ARG}\": "
                f"\"{sandbox.handle}\" in later calls to keep using its files and jobs; "
                f"without \"{SANDBOX_ARG}\" a call uses your default sandbox.]")))
        return result.model_copy(update={"content": content, "structured_content": structured})

    @staticmethod
    async def _send_output(ctx: ServerRequestContext[Any, Any],
                           outbox: asyncio.Queue[OutputEvent | EgressEvent | None]) -> None:
        level = _connection(ctx).state.get(_LOG_LEVEL_KEY)  # set by the client's logging/setLevel
        log = level is None or LOG_LEVELS.index("info") >= LOG_LEVELS.index(level)
        sent = 0
        while (event := await outbox.get()) is not None:
            if not isinstance(event, OutputEvent):  # an egress event: a log notification only
                if log:
                    from ...egress.session import event_record  # loaded only in egress mode

                    await _log(ctx, event_record(event), "egress")
                continue
            sent += len(event.text)
            with contextlib.suppress(Exception):  # notifications are advisory; never fail a call
                await ctx.session.report_progress(sent, message=event.text)
            if log:
                await _log(ctx, event.text, event.stream)


async def _log(ctx: ServerRequestContext[Any, Any], data: Any, logger: str) -> None:
    """A log notification, for clients that opted in to them (deprecated by the 2026-07-28
    protocol, still what many clients show; the SDK warns about that). Advisory: never fails
    a call."""
    with warnings.catch_warnings(), contextlib.suppress(Exception):
        warnings.simplefilter("ignore")
        await ctx.session.send_log_message("info", data, logger=logger,
                                           related_request_id=ctx.request_id)


def build_server(factory: ToolkitFactory, approvals: bool = False, shared: bool = False,
                 one_client: bool = False, branching: bool = False
                 ) -> tuple[Server[Any], McpTools]:
    tools = McpTools(factory, approvals, shared, one_client, branching)
    share_with_libraries()  # the SDK's tools/call span: the client's traceparent its parent
    with warnings.catch_warnings():
        # logging/setLevel is deprecated by 2026-07-28 but is how 2025-11-25 clients opt in to
        # the log notifications this server sends; declaring it is what the protocol asks.
        warnings.simplefilter("ignore")
        server: Server[Any] = Server("toolseam", version=__version__,
                                     instructions=describe(tools.probe, shared, not tools.single,
                                                           branching),
                                     on_list_tools=tools.list_tools, on_call_tool=tools.call_tool,
                                     on_set_logging_level=tools.set_logging_level)
    # Seal requestState (AES-GCM, bound to the tool, its arguments and a deadline): a client can
    # only echo what this server minted. The nonce check in McpTools holds without it too.
    server.middleware.append(RequestStateBoundary(RequestStateSecurity.ephemeral(),
                                                  default_audience="toolseam"))
    return server, tools


async def serve_stdio(factory: ToolkitFactory, approvals: bool = False,
                      shared: bool = False, branching: bool = False) -> None:
    from mcp.server.stdio import stdio_server

    server, tools = build_server(factory, approvals, shared, one_client=True,
                                 branching=branching)
    try:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await tools.close_all()
