"""``toolseam snapshots``: list, remove and prune the snapshots in this user's store
(``backends/snapshots/store.py``; docs/branching.md)."""

from __future__ import annotations

import argparse
import re
import time

from ..backends.snapshots import SnapshotStore
from ..seam.errors import ConfigurationError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``7d``, ``2w`` as seconds."""
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise ConfigurationError(f"--older-than: {text!r} is not a duration (e.g. 90s, 15m, "
                                 "12h, 7d, 2w)")
    return float(found[1]) * _UNITS[found[2] or "s"]


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = commands.add_parser(
        "snapshots", help="list, remove or prune this user's session snapshots",
        description="Snapshots (Toolkit.snapshot, fork) stay in this user's store until "
        "removed here; closing a session never removes them.")
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="one line per snapshot: id, created, size added, backend, "
                     "session, label")
    remove = verbs.add_parser("rm", help="remove snapshots (and the stored files only they "
                              "name)")
    remove.add_argument("ids", nargs="+", metavar="ID")
    prune = verbs.add_parser("prune", help="remove the snapshots older than a duration")
    prune.add_argument("--older-than", required=True, metavar="DURATION",
                       help="e.g. 90s, 15m, 12h, 7d, 2w")


def run(args: argparse.Namespace) -> int:
    """``toolseam snapshots``; errors are raised (the CLI prints them)."""
    store = SnapshotStore()
    if args.verb == "list":
        for snap in store.all():
            created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(snap.created))
            print(f"{snap.id}  {created}  {snap.size_bytes:>12}  {snap.backend:<8} "
                  f"{snap.session:<12} {snap.label or ''}")
    elif args.verb == "rm":
        freed = store.remove(args.ids)
        print(f"removed {len(args.ids)} snapshot(s); {freed} bytes freed")
    else:
        gone = store.prune(parse_duration(args.older_than))
        print(f"removed {len(gone)} snapshot(s)" + (f": {' '.join(gone)}" if gone else ""))
    return 0
