"""``toolseam snapshot`` and ``toolseam restore`` (decision 432): the files of a session kept
and put back from the command line, over ``Toolkit.snapshot``/``restore`` (docs/branching.md).

They act on one of two things:

* a durable session, by its handle (``--attach FILE``, the handle ``serve --detach-on-eof``
  printed): attached, snapshotted or restored, detached again — the sandbox and its other
  jobs go on (a restore ends the jobs still running, and says which);
* a directory, through a session opened over it as ``toolseam call`` opens one (``--base-dir``
  on the host, ``--workspace`` with a container backend) and closed after. ``snapshot``
  defaults to the current directory; ``restore`` replaces a directory's whole tree, so it
  wants the directory named.

Each prints the result as one JSON line (the ``Snapshot`` or the ``RestoreResult``).
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable

from ..backends import DEFAULT_BACKEND
from ..backends.snapshots import RestoreResult, Snapshot
from ..seam.errors import ConfigurationError
from ..session.toolkit import Toolkit

OpenSession = Callable[[argparse.Namespace], Toolkit]  # a session over the named directory
AttachSession = Callable[[str], Awaitable[Toolkit]]  # the durable session a handle file names

# Flags that shape a new session: meaningless with --attach, whose session is as it is.
_SESSION_FLAGS = ("base_dir", "config", "image", "workspace", "endpoint", "workspace_mode",
                  "pull", "registry_user", "memory", "cpus", "pids", "network", "egress_allow",
                  "tmpfs_size")


def add_parsers(commands: argparse._SubParsersAction,  # type: ignore[type-arg]
                session_options: Callable[[argparse.ArgumentParser], None]) -> None:
    attach_help = ("act on the durable session whose handle FILE holds (the handle line "
                   "'serve --detach-on-eof' printed); it is detached again after, not closed")
    snapshot = commands.add_parser(
        "snapshot", help="keep a session's files as a snapshot; prints it as JSON",
        description="Keep the files of a durable session (--attach FILE) or of a directory "
        "(--base-dir DIR, default the current one; --workspace DIR with a container backend) "
        "in this user's snapshot store, and print the snapshot as one JSON line. Running "
        "processes are not kept. 'toolseam snapshots' lists and removes them.")
    snapshot.add_argument("--label", help="your name for the snapshot")
    snapshot.add_argument("--attach", metavar="FILE", help=attach_help)
    session_options(snapshot)
    restore = commands.add_parser(
        "restore", help="make a session's files exactly a snapshot's; prints what changed",
        description="Make the files of a durable session (--attach FILE) or of a directory "
        "(--base-dir DIR; --workspace DIR with a container backend) exactly the snapshot's: "
        "names added since are removed, removed ones come back, contents and modes as they "
        "were. A durable session's running jobs are ended first (the result lists them).")
    restore.add_argument("snapshot", metavar="ID", help="the snapshot's id (toolseam "
                         "snapshots list)")
    restore.add_argument("--attach", metavar="FILE", help=attach_help)
    session_options(restore)


def _check(args: argparse.Namespace) -> None:
    """Refuse, before anything opens, flags that cannot go together or a missing target."""
    given = [f"--{name.replace('_', '-')}" for name in _SESSION_FLAGS if getattr(args, name, None)]
    given += [flag for flag, on in (("--backend", args.backend != DEFAULT_BACKEND),
                                    ("--confine", args.confine),
                                    ("--rootless", args.rootless)) if on]
    if args.attach and given:
        raise ConfigurationError(f"{args.command} --attach acts on the session as it is: drop "
                                 f"{', '.join(given)}")
    if args.command == "restore" and not (args.attach or args.base_dir or args.workspace):
        raise ConfigurationError("restore replaces a whole tree: name it with --base-dir DIR "
                                 "(--workspace DIR with a container backend) or --attach FILE "
                                 "(a durable session's handle)")


async def run(args: argparse.Namespace, open_session: OpenSession,
              attach: AttachSession) -> str:
    """The result's JSON line; errors are raised (the CLI prints them)."""
    _check(args)
    chosen = Snapshot.load(args.snapshot) if args.command == "restore" else None  # a bad id first
    toolkit = await attach(args.attach) if args.attach else open_session(args)
    result: Snapshot | RestoreResult
    try:
        result = (await toolkit.restore(chosen) if chosen is not None
                  else await toolkit.snapshot(args.label))
    finally:
        if args.attach:
            await toolkit.detach()
        else:
            await toolkit.close()
    return result.model_dump_json()
