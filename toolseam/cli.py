"""``toolseam`` command line: call, tools, demo, serve.

Exit codes: 0 whenever a tool result was produced (error results included); 2 for a host
error (bad arguments, invalid configuration, unknown tool), with the message on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from .declarations import FORMATS
from .policy.settings import Settings, load_settings
from .seam.errors import HostError
from .toolkit import Toolkit


def _session_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", default="host", choices=("host", "podman", "docker"))
    parser.add_argument("--base-dir", help="directory relative paths resolve against")
    parser.add_argument("--confine", action="store_true", help="refuse paths outside the base dir")
    parser.add_argument("--config", help="settings file (.toml or .json)")
    parser.add_argument("--image", help="sandbox image (container backends)")
    parser.add_argument("--rootless", action="store_true", help="rootless podman")
    parser.add_argument("--workspace", help="host dir mounted at /workspace (container backends)")


def _toolkit(args: argparse.Namespace, settings: Settings | None = None) -> Toolkit:
    settings = settings or (load_settings(args.config) if args.config else Settings())
    options: dict[str, Any] = {}
    if args.backend != "host":
        if args.image:
            options["image"] = args.image
        if args.rootless:
            options["rootless"] = True
        options["workspace"] = args.workspace or args.base_dir or "."
        base_dir = args.base_dir if args.base_dir and args.base_dir.startswith("/workspace") else None
        if args.confine and base_dir is None:
            base_dir = "/workspace"
    else:
        base_dir = args.base_dir
    return Toolkit(args.backend, base_dir=base_dir, confine_to_base_dir=args.confine,
                   settings=settings, backend_options=options)


async def _call(args: argparse.Namespace) -> int:
    try:
        tool_args = json.loads(args.json_args)
    except ValueError as exc:
        raise HostError(f"JSON-ARGS is not valid JSON: {exc}") from None
    toolkit = _toolkit(args)
    try:
        result = await toolkit.call(args.tool, tool_args)
    finally:
        await toolkit.close()
    print(json.dumps(result.to_json(), ensure_ascii=False))
    return 0


def _tools(args: argparse.Namespace) -> int:
    settings = load_settings(args.config) if args.config else Settings()
    toolkit = Toolkit("host", settings=settings)
    print(json.dumps(toolkit.declarations(args.format), indent=2, ensure_ascii=False))
    return 0


async def _serve(args: argparse.Namespace) -> int:
    from .server import StdioServer

    await StdioServer(_toolkit(args), stream=args.stream, approvals=args.approvals).run()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolseam", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    call = commands.add_parser("call", help="run one tool call and print its result as JSON")
    call.add_argument("tool")
    call.add_argument("json_args", metavar="JSON-ARGS")
    _session_options(call)
    tools = commands.add_parser("tools", help="print the tool declarations")
    tools.add_argument("--format", choices=FORMATS, default="openai")
    tools.add_argument("--config")
    commands.add_parser("demo", help="a scripted agent session on a temporary workspace")
    serve = commands.add_parser("serve", help="hold one session, driven by JSON lines on stdio")
    serve.add_argument("--stdio", action="store_true", required=True)
    serve.add_argument("--stream", action="store_true", help="send live output lines")
    serve.add_argument("--approvals", action="store_true", help="ask before reads outside scope")
    _session_options(serve)
    args = parser.parse_args(argv)
    try:
        if args.command == "call":
            return asyncio.run(_call(args))
        if args.command == "tools":
            return _tools(args)
        if args.command == "demo":
            from .demo import run_demo

            return asyncio.run(run_demo())
        return asyncio.run(_serve(args))
    except HostError as exc:
        print(f"toolseam: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
