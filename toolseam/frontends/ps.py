"""``toolseam ps``: every live session of this user on this machine (``observability/live.py``),
as a table or ``--json``; ``--watch`` refreshes it; ``--kill ID`` ends one sandbox with
everything in it (its owner's calls then fail as ``sandbox_lost``). ``--ray ADDRESS`` asks a
Ray cluster's toolseam node actors instead (``ray/operator.py``): every session there that a
holder of this cluster key opened, from whichever machine."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from typing import Any

from ..observability.live import kill_session, live_sessions
from ..seam.errors import ConfigurationError

JSON_FIELDS = ("id", "backend", "image", "started", "owner_pid", "durable", "calls",
               "cpu_seconds", "memory_bytes")


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = commands.add_parser(
        "ps", help="list (or kill) the live sessions of this user on this machine",
        description="Every live session of this user on this machine: its backend, image, "
        "owner, calls, CPU and memory. Sessions answer through a 0700 per-user directory.")
    parser.add_argument("--json", action="store_true", help="a JSON list of objects")
    parser.add_argument("--watch", action="store_true", help="refresh until interrupted")
    parser.add_argument("--interval", type=float, default=2.0, metavar="S",
                        help="seconds between refreshes with --watch (default 2)")
    parser.add_argument("--kill", metavar="ID", help="end the sandbox of session ID and "
                        "everything in it")
    parser.add_argument("--ray", metavar="ADDRESS", help="the sessions of the Ray cluster at "
                        "ADDRESS (its toolseam nodes, for holders of this cluster key) instead "
                        "of this machine's")
    parser.set_defaults(handler=run)


def rows(ray_address: str | None = None) -> list[dict[str, Any]]:
    """The sessions as ``--json`` prints them (``started``: ISO 8601, UTC): this machine's, or
    with ``ray_address`` that Ray cluster's."""
    found = []
    for row in live_sessions() if ray_address is None else _Cluster(ray_address).sessions():
        shown = {name: row.get(name) for name in JSON_FIELDS}
        shown["started"] = datetime.datetime.fromtimestamp(
            float(row["started"]), datetime.UTC).isoformat(timespec="seconds")
        shown["node"] = row.get("node")
        shown["pids"] = row.get("pids")
        found.append(shown)
    return sorted(found, key=lambda r: (str(r["started"]), str(r["id"])))


def _table(found: list[dict[str, Any]]) -> str:
    lines = [f"{'ID':<10} {'BACKEND':<16} {'IMAGE':<34} {'STARTED':<20} {'OWNER':>7} "
             f"{'DURABLE':<7} {'CALLS':>5} {'CPU s':>8} {'MEM MiB':>8}"]
    for r in found:
        cpu = "-" if r["cpu_seconds"] is None else f"{r['cpu_seconds']:.2f}"
        mem = "-" if r["memory_bytes"] is None else f"{r['memory_bytes'] / (1 << 20):.1f}"
        lines.append(f"{r['id']:<10} {r['backend']:<16} {(r['image'] or '-')[-34:]:<34} "
                     f"{r['started'][:19]:<20} {r['owner_pid']:>7} "
                     f"{'yes' if r['durable'] else 'no':<7} {r['calls']:>5} {cpu:>8} {mem:>8}")
    return "\n".join(lines)


class _Cluster:
    """A Ray cluster's sessions (the ray extra, imported only when asked for)."""

    def __init__(self, address: str) -> None:
        from ..ray import operator  # the ray extra's
        self.address, self.operator = address, operator

    def sessions(self) -> list[dict[str, Any]]:
        return self.operator.cluster_sessions(self.address)

    def kill(self, session_id: str) -> bool:
        return self.operator.kill_on_cluster(self.address, session_id)


def run(args: argparse.Namespace) -> int:
    if args.kill:
        ended = kill_session(args.kill) if args.ray is None else _Cluster(args.ray).kill(args.kill)
        if not ended:
            where = "of this user" if args.ray is None else f"on the Ray cluster at {args.ray}"
            raise ConfigurationError(f"ps --kill: no live session {args.kill!r} {where}")
        print(f"killed session {args.kill}")
        return 0
    if args.interval <= 0:
        raise ConfigurationError("ps --interval must be above 0")
    while True:
        found = rows(args.ray)
        if args.json:
            print(json.dumps(found), flush=True)
        else:
            if args.watch and sys.stdout.isatty():
                print("\033[H\033[J", end="")
            print(_table(found), flush=True)
        if not args.watch:
            return 0
        time.sleep(args.interval)
