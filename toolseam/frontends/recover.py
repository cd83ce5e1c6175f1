"""``toolseam recover``: the command line over ``backends/containers/recover.py`` — list,
copy out or remove the work a failed copy-back kept."""

from __future__ import annotations

import argparse
import contextlib
import os

from ..backends import KINDS, engine_for
from ..backends.containers.engine.protocol import Engine
from ..backends.containers.labels import KEPT_RETENTION_S
from ..backends.containers.recover import copy_out, find, kept, remove
from ..seam.errors import ConfigurationError


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = commands.add_parser(
        "recover", help="list, copy out or remove work kept after a failed copy-back",
        description="When close could not copy a sandbox's changes back, the container and its "
        f"workspace volume are kept for {KEPT_RETENTION_S // 86400} days. "
        "--list shows them; CONTAINER --to DIR copies the workspace into the new directory "
        "DIR; CONTAINER --remove removes them.")
    parser.add_argument("--backend", required=True, choices=[  # the kinds with an engine
        kind.name for kind in KINDS.values() if kind.engine_function is not None])
    parser.add_argument("--rootless", action="store_true", help="rootless podman")
    parser.add_argument("--endpoint", help="engine URL (default from the environment, as for "
                        "'toolseam call')")
    parser.add_argument("--list", action="store_true", help="list the kept sandboxes")
    parser.add_argument("--to", metavar="DIR", help="copy the kept workspace into DIR (new)")
    parser.add_argument("--remove", action="store_true", help="remove the kept container, "
                        "its volume and its mark")
    parser.add_argument("container", nargs="?", metavar="CONTAINER",
                        help="the kept container's id (a prefix will do) or name")


def run(args: argparse.Namespace) -> int:
    """``toolseam recover``; errors are raised (the CLI prints them as it does for any call)."""
    if args.list == bool(args.container) or (args.container and not (args.to or args.remove)):
        raise ConfigurationError("recover: give --list, or CONTAINER with --to DIR and/or "
                                 "--remove")
    engine: Engine = engine_for(args.backend, args.endpoint,
                                **({"rootless": True} if args.rootless else {}))
    try:
        if args.list:
            for item in kept(engine):
                print(item.line())
            return 0
        item = find(engine, args.container)
        if args.to:
            refused = copy_out(engine, item, args.to)
            print(f"copied the workspace of {item.container[:12]} to {os.path.abspath(args.to)}"
                  + (f"; refused: {', '.join(refused)}" if refused else ""))
        if args.remove:
            remove(engine, item)
            print(f"removed {item.container[:12]} and its workspace volume")
        return 0
    finally:
        with contextlib.suppress(Exception):
            engine.close()
