"""``toolseam`` command line: call, tools, demo, serve, mcp, snapshot, restore.

Exit codes: 0 the tool succeeded; 1 the result is a tool failure; 3 the sandbox could not run
the call (``call`` prints the JSON result in each of those cases); 2 a usage or configuration
error, one line on stderr; 130 interrupted (Ctrl-C); 141 stdout was closed early (``| head``),
quietly, as a tool killed by SIGPIPE. No expected failure prints a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from .. import __version__
from ..backends import BACKENDS, DEFAULT_BACKEND, backend_kind
from ..policy.settings import Settings, parse_settings, read_settings_data
from ..seam.errors import ConfigurationError, CouldNotRunError, HostError
from ..seam.handle import SessionHandle
from ..session.declarations import FORMATS
from ..session.toolkit import Toolkit
from . import branch_commands
from .cli_terms import in_cli_terms
from .demo import run_demo
from .interrupt import run_interruptible
from .metrics_server import add_parser as add_metrics_parser
from .ps import add_parser as add_ps_parser
from .recover import add_parser as add_recover_parser
from .recover import run as run_recover
from .snapshots import add_parser as add_snapshots_parser
from .snapshots import run as run_snapshots
from .stdio import StdioServer

EXIT_OK, EXIT_TOOL_FAILED, EXIT_USAGE, EXIT_COULD_NOT_RUN, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a tool killed by SIGPIPE

# The tools with their arguments (? = optional); a test keeps this in step with the schemas.
_CALL_EPILOG = """\
tools and their JSON-ARGS (? = optional; `toolseam tools` prints the full schemas):
  bash         run a shell command        {"command", "timeout"?: ms, "workdir"?, "description"?}
  read         a file as numbered lines   {"path", "offset"?, "limit"?}
  write        create or replace a file   {"path", "content"}
  edit         replace exact text         {"path", "oldString", "newString", "replaceAll"?}
  apply_patch  a '*** Begin Patch' patch  {"patchText"}
  grep         search contents (regex)    {"pattern", "path"?, "include"?, "limit"?}
  glob         list files by pattern      {"pattern", "path"?, "limit"?}

examples:
  toolseam call read '{"path": "README.md"}' --base-dir . --confine
  toolseam call bash '{"command": "make test", "timeout": 120000}' --base-dir .
  toolseam call glob '{"pattern": "**/*.py"}' --base-dir src
  toolseam call write - --base-dir . < args.json          # JSON-ARGS from stdin

exit codes (the JSON result, or with --model-text the model's text, is on stdout for 0, 1, 3):
  0    the tool succeeded
  1    the tool failed (is_error true: a failing command, a missing file ...)
  2    usage or configuration error (one line on stderr)
  3    the sandbox could not run the call (metadata.failure "could_not_run")
  130  interrupted (Ctrl-C)
  141  stdout was closed early (e.g. | head)
"""

_MCP_DESCRIPTION = """\
Serve the seven tools over MCP: stdio by default, or streamable HTTP with --http.

Over HTTP, bash is a shell as the user running this server for whoever reaches the port, and
on a shared machine every local user reaches 127.0.0.1. So every TCP request must carry
'Authorization: Bearer TOKEN': your token (--auth-token-file, TOOLSEAM_MCP_TOKEN), or, on
loopback when you give none, one generated into a file only you can read, whose path the
start-up line names (removed when the server stops). --http unix:PATH needs no token: the
socket's mode 0600 lets only you (and root) connect. There is no way to serve without either.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is ONE line on stderr (exit 2), not the usage block."""

    def error(self, message: str) -> NoReturn:
        if message.endswith("required: command"):  # bare `toolseam`: say what the commands are
            commands = next(a for a in self._actions if isinstance(a, argparse._SubParsersAction))
            message = f"choose a command: {', '.join(commands.choices)}"
        self.exit(EXIT_USAGE, f"toolseam: {message} (see 'toolseam {self._sub()}--help')\n")

    def _sub(self) -> str:
        name = self.prog.removeprefix("toolseam").strip()
        return f"{name} " if name else ""


def _session_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default=DEFAULT_BACKEND, choices=BACKENDS)
    parser.add_argument("--base-dir", help="directory relative paths resolve against")
    parser.add_argument("--confine", action="store_true", help="refuse paths outside the base dir")
    parser.add_argument("--config", help="settings file (.toml or .json)")
    parser.add_argument("--image", help="sandbox image (container backends)")
    parser.add_argument("--rootless", action="store_true", help="rootless podman")
    parser.add_argument("--workspace", help="host dir mounted at /workspace (container backends)")
    parser.add_argument("--endpoint", help="engine URL: unix:///…, tcp://HOST:PORT (docker's "
                        "TLS from DOCKER_CERT_PATH/DOCKER_TLS_VERIFY); default from the "
                        "environment (TOOLSEAM_DOCKER_URL, DOCKER_HOST, TOOLSEAM_PODMAN_URL)")
    parser.add_argument("--workspace-mode", choices=("auto", "bind", "copy"),
                        help="bind-mount the workspace or copy it in and back (default auto: "
                        "bind for a unix socket, copy for an engine over the network)")
    parser.add_argument("--pull", choices=("never", "missing", "always"),
                        help="pull the image: never, when missing (default), always")
    parser.add_argument("--registry-user", help="registry user for the pull; the password comes "
                        "from TOOLSEAM_REGISTRY_PASSWORD (default: the engine's own credentials)")
    limits = parser.add_argument_group("sandbox limits (container backends)")
    limits.add_argument("--memory", help="memory limit, e.g. 256m (default 2g)")
    limits.add_argument("--cpus", type=float, help="CPUs, e.g. 0.5 (default: no limit)")
    limits.add_argument("--pids", type=int, help="most processes at once (default 1024)")
    limits.add_argument("--network", choices=("none", "bridge", "egress"),
                        help="default none; egress: only the hosts --egress-allow names, "
                        "through the session's proxy (every backend; docs/network.md)")
    limits.add_argument("--egress-allow", action="append", metavar="HOST[:PORT]",
                        help="with --network egress: a host the sandbox may reach (repeatable; "
                        "*.DOMAIN for names below it; without a port, 80 and 443)")
    limits.add_argument("--tmpfs-size", help="size of /tmp (default 512m)")


# The flags that are settings, by where they go in the settings' mapping: merged into the
# --config file's mapping BEFORE anything is validated, so a file's egress_allow and
# --network egress make one valid whole (and an error names the flag, not the key).
_LIMIT_FLAGS = {"memory": "--memory", "cpus": "--cpus", "pids": "--pids",
                "network": "--network", "tmpfs_size": "--tmpfs-size"}


def _settings(args: argparse.Namespace) -> Settings:
    config = getattr(args, "config", None)
    data = read_settings_data(config) if config else {}
    orphan = getattr(args, "orphan_timeout", None)
    if orphan is not None:
        data["orphan_timeout_s"] = orphan
    limits = {key: value for key in _LIMIT_FLAGS
              if (value := getattr(args, key, None)) is not None}
    if limits:
        data["limits"] = {**dict(data.get("limits") or {}), **limits}
    allow = getattr(args, "egress_allow", None) or []
    if allow:
        data["egress_allow"] = [*list(data.get("egress_allow") or []), *allow]
    try:
        return parse_settings(data, config or "settings")
    except ConfigurationError as exc:
        message = str(exc)
        for key, flag in _LIMIT_FLAGS.items():
            if key in limits:
                message = message.replace(f"limits.{key}", flag)
        if allow and not config:
            message = message.replace("egress_allow", "--egress-allow")
        message = message.replace('limits.network = "egress" (--network egress)',
                                  "--network egress")
        raise ConfigurationError(message.replace('limits.network = "egress"', "--network egress")
                                 ) from None


def _toolkit(args: argparse.Namespace) -> Toolkit:
    settings = _settings(args)
    options: dict[str, Any] = {}
    if backend_kind(args.backend).contained:
        if args.image:
            options["image"] = args.image
        if args.rootless:
            options["rootless"] = True
        if args.pull:
            options["pull"] = args.pull
        if args.endpoint:
            options["endpoint"] = args.endpoint
        if args.workspace_mode:
            options["workspace_mode"] = args.workspace_mode
        if args.registry_user:
            options["auth"] = {"username": args.registry_user,
                               "password": os.environ.get("TOOLSEAM_REGISTRY_PASSWORD", "")}
        if sys.stderr.isatty():
            options["on_pull_progress"] = _progress_bar()
        options["workspace"] = args.workspace or args.base_dir or "."
        base_dir = args.base_dir if args.base_dir and args.base_dir.startswith("/workspace") else None
        if args.confine and base_dir is None:
            base_dir = "/workspace"
    else:
        if args.confine and not args.base_dir:
            raise ConfigurationError("--confine needs --base-dir (the directory to confine to)")
        if (args.rootless or args.image or args.workspace or args.pull or args.registry_user
                or args.endpoint or args.workspace_mode):
            raise ConfigurationError("--image, --rootless, --workspace, --pull, --endpoint, "
                                     "--workspace-mode and --registry-user need --backend "
                                     "podman or docker")
        base_dir = args.base_dir
    return Toolkit(args.backend, base_dir=base_dir, confine_to_base_dir=args.confine,
                   settings=settings, backend_options=options)


def _progress_bar() -> Any:
    """A one-line pull progress on a terminal: layers done, bytes of the layer moving now."""
    done: set[str] = set()

    def show(event: Any) -> None:
        if event.status.lower().startswith(("pull complete", "already exists")) and event.layer:
            done.add(event.layer)
        moving = (f" {event.current >> 20}/{event.total >> 20} MiB"
                  if event.current is not None and event.total else "")
        line = f"pulling {event.image}: {len(done)} layers done, {event.status}{moving}"
        sys.stderr.write("\r" + line[:100].ljust(100))
        sys.stderr.flush()

    return show


def result_exit_code(result: Any) -> int:
    if not result.is_error:
        return EXIT_OK
    if result.metadata.get("failure") == "could_not_run":
        return EXIT_COULD_NOT_RUN
    return EXIT_TOOL_FAILED


async def _call(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.json_args == "-" else args.json_args  # no shell quoting
    try:
        tool_args = json.loads(text)
    except ValueError as exc:
        raise ConfigurationError(f"JSON-ARGS is not valid JSON: {exc}") from None
    toolkit = _toolkit(args)
    try:
        result = await toolkit.call(args.tool, tool_args)
    finally:
        await toolkit.close()
    shown = result.model_text() if args.model_text else json.dumps(result.to_json(),
                                                                      ensure_ascii=False)
    if result.metadata.get("failure") == "could_not_run":  # toolseam's words, not a command's
        shown = in_cli_terms(shown)
    print(shown)
    return result_exit_code(result)


def _tools(args: argparse.Namespace) -> int:
    toolkit = Toolkit("host", settings=_settings(args))
    print(json.dumps(toolkit.declarations(args.format), indent=2, ensure_ascii=False))
    return EXIT_OK


async def _serve(args: argparse.Namespace) -> int:
    if args.attach:  # the session's own settings, base dir and backend come with it
        given = [flag for flag, value in (("--backend", args.backend != DEFAULT_BACKEND),
                                          ("--base-dir", args.base_dir), ("--config", args.config),
                                          ("--orphan-timeout", args.orphan_timeout)) if value]
        if given:
            raise ConfigurationError(f"--attach continues a session as it is: drop "
                                     f"{', '.join(given)}")
        toolkit = await Toolkit.attach(_read_handle(args.attach))
    else:
        toolkit = _toolkit(args)
    if args.detach_on_eof and toolkit.settings.orphan_timeout_s <= 0:
        raise ConfigurationError("--detach-on-eof needs orphan_timeout_s above 0 (how long the "
                                 "sandbox waits for an attach): --orphan-timeout SECONDS, or "
                                 "the setting in --config")
    await StdioServer(toolkit, stream=args.stream, approvals=args.approvals,
                      detach_on_eof=args.detach_on_eof).run()
    return EXIT_OK


def _read_handle(path: str) -> SessionHandle:
    """A handle file: the handle's JSON, or the ``{"op": "handle"}`` line serve printed."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"--attach: cannot read {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("op") in ("handle", "detached"):
        return SessionHandle.model_validate(data.get("handle"))
    return SessionHandle.from_json(text)


async def _attach_file(path: str) -> Toolkit:
    return await Toolkit.attach(_read_handle(path))


async def _branch(args: argparse.Namespace) -> int:
    print(await branch_commands.run(args, _toolkit, _attach_file))
    return EXIT_OK


def _mcp(args: argparse.Namespace) -> int:
    # mcp_server first: without the mcp extra it raises the error naming the install line
    from .mcp.server import serve_stdio

    # A typo in a client's config must stop the server, not make every tool call fail later.
    container = backend_kind(args.backend).contained
    for flag, path in (("--base-dir", None if container else args.base_dir),
                       ("--workspace", (args.workspace or args.base_dir) if container else None)):
        if path and not (container and path.startswith("/workspace")) and not os.path.isdir(path):
            problem = "is not a directory" if os.path.exists(path) else "does not exist"
            raise ConfigurationError(f"{flag} {path} {problem} on this host")
    _toolkit(args)  # check the options once, before any client connects

    def factory() -> Toolkit:
        return _toolkit(args)

    if args.http:
        from .mcp.http import serve_http
        from .mcp.listen import parse_address

        serve_http(factory, parse_address(args.http), approvals=args.approvals,
                   token_file=args.auth_token_file, shared=args.shared_sandbox,
                   branching=args.branching)
    elif args.auth_token_file:
        raise ConfigurationError("--auth-token-file needs --http (stdio has no network to guard)")
    else:
        run_interruptible(serve_stdio(factory, approvals=args.approvals, shared=args.shared_sandbox,
                                      branching=args.branching))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="toolseam", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--version", action="version", version=f"toolseam {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    call = commands.add_parser("call", help="run one tool call and print its result as JSON",
                               description="Run one tool call in a fresh session (opened, then "
                               "closed) and print its result as one JSON line.",
                               epilog=_CALL_EPILOG,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    call.add_argument("tool", help="bash, read, write, edit, apply_patch, grep or glob")
    call.add_argument("json_args", metavar="JSON-ARGS",
                      help="the tool's arguments as a JSON object, or - to read them from stdin")
    call.add_argument("--model-text", action="store_true", help="print the text a model is shown "
                      "(output within model_output_chars, cuts marked, notes) instead of the JSON")
    _session_options(call)
    tools = commands.add_parser("tools", help="print the tool declarations")
    tools.add_argument("--format", choices=FORMATS, default="openai")
    tools.add_argument("--config")
    commands.add_parser("demo", help="a scripted agent session on a temporary workspace")
    serve = commands.add_parser("serve", help="hold one session, driven by JSON lines on stdio")
    serve.add_argument("--stdio", action="store_true", required=True)
    serve.add_argument("--stream", action="store_true", help="send live output lines")
    serve.add_argument("--approvals", action="store_true", help="ask before reads outside scope")
    serve.add_argument("--orphan-timeout", type=float, metavar="SECONDS",
                       help="the setting orphan_timeout_s: the session outlives this process "
                       "that long (docs/sessions.md)")
    serve.add_argument("--detach-on-eof", action="store_true", help="at EOF on stdin, detach "
                       "instead of closing: the sandbox and its jobs go on, the last line "
                       "holds the handle")
    serve.add_argument("--attach", metavar="FILE", help="continue the session whose handle "
                       "FILE holds (the handle's JSON, or the handle line serve printed)")
    _session_options(serve)
    mcp = commands.add_parser("mcp", help="serve the seven tools over MCP (stdio, or --http)",
                              description=_MCP_DESCRIPTION,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    mcp.add_argument("--http", metavar="HOST:PORT|unix:PATH", help="streamable HTTP at /mcp "
                     "instead of stdio; on TCP every request needs a bearer token (generated "
                     "when none is given, below); unix:PATH makes a socket of mode 0600")
    mcp.add_argument("--approvals", action="store_true",
                     help="ask the client (MCP elicitation) before reads outside scope")
    mcp.add_argument("--auth-token-file", metavar="PATH", help="bearer token every HTTP request "
                     "must carry (or set TOOLSEAM_MCP_TOKEN); required for a non-loopback --http; "
                     "on loopback without it a token is generated into an owner-only file")
    mcp.add_argument("--shared-sandbox", action="store_true", help="one sandbox for every client "
                     "(jobs, files and approvals shared); default: one per client")
    mcp.add_argument("--branching", action="store_true", help="add the tools snapshot, restore "
                     "and fork (docs/branching.md); a fork's sandboxes are reached by the "
                     "handle its result names, passed as \"sandbox\"")
    _session_options(mcp)
    branch_commands.add_parsers(commands, _session_options)  # toolseam snapshot | restore
    add_recover_parser(commands)  # toolseam recover: work kept after a failed copy-back
    add_snapshots_parser(commands)  # toolseam snapshots: list | rm | prune
    add_ps_parser(commands)  # toolseam ps: live sessions (observability, issue 49)
    add_metrics_parser(commands)  # toolseam metrics: their Prometheus endpoint
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        # The reader went away (`toolseam call ... | head`): stop quietly, as tools killed by
        # SIGPIPE do. stdout now points at /dev/null so the interpreter's final flush of what
        # is still buffered cannot fail a second time.
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "call":
            return run_interruptible(_call(args))
        if args.command == "tools":
            return _tools(args)
        if args.command == "demo":
            return run_interruptible(run_demo())
        if args.command == "mcp":
            return _mcp(args)
        if args.command == "recover":
            return run_recover(args)
        if args.command == "snapshots":
            return run_snapshots(args)
        if args.command in ("snapshot", "restore"):
            return run_interruptible(_branch(args))
        if getattr(args, "handler", None) is not None:  # a subcommand in its own module
            return int(args.handler(args))
        return run_interruptible(_serve(args))
    except HostError as exc:
        print(f"toolseam: {in_cli_terms(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except CouldNotRunError as exc:
        print(f"toolseam: could not run: {in_cli_terms(exc.reason)}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    except KeyboardInterrupt:
        print("toolseam: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
