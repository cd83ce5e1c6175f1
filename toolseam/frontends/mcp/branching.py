"""``toolseam mcp --branching``: the tools ``snapshot``, ``restore`` and ``fork`` over
``Toolkit``'s branching (docs/branching.md), off unless the operator turns them on.

What they mean for an MCP client (decisions 430 and 431):

* ``snapshot`` keeps the caller's sandbox's files and returns the snapshot's id and facts. The
  server remembers whose it is: ``restore`` takes only an id this server took for the same
  principal (bearer token, or the one local principal), so a client never reads another
  client's snapshot, nor one of the server user's own snapshots of other directories.
* ``restore`` makes the caller's sandbox's files exactly the snapshot's — any of that
  principal's sandboxes: restoring a fork's snapshot into its parent is how a branch that won
  comes home over MCP.
* ``fork`` opens n sandboxes from the caller's files now and returns their *handles*: each
  child lives in this server as a handle sandbox of the caller's principal (the table of
  ``sandboxes.py``, its limits and idle close), reached by passing its handle as ``sandbox``.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from ...backends.snapshots import RestoreResult, Snapshot
from ...builtins import ToolResult, could_not_run_result
from ...seam.errors import CouldNotRunError, HostError
from ...session.toolkit import Toolkit
from .sandboxes import MOST_HANDLES, Sandbox

NAMES = ("snapshot", "restore", "fork")
_MOST_ID = 64  # a longer "id" is nobody's: it is not echoed whole


def _declaration(name: str, description: str, argument: str, schema: dict[str, Any], *,
                 required: bool) -> dict[str, Any]:
    """One tool's declaration: it takes the one ``argument`` and nothing else."""
    accepts: dict[str, Any] = {"type": "object", "properties": {argument: schema}}
    if required:
        accepts["required"] = [argument]
    accepts["additionalProperties"] = False
    return {"name": name, "description": description, "input_schema": accepts}


DECLARATIONS: list[dict[str, Any]] = [
    _declaration("snapshot", (
        "Keep this sandbox's files now (the whole workspace: contents, modes, links, empty "
        "directories) as a snapshot, and return its id. Running processes are not kept. "
        "Pass the id to restore to put the files back exactly as they are now."),
        "label", {"type": "string", "description": "your name for the snapshot (optional)"},
        required=False),
    _declaration("restore", (
        "Make this sandbox's files exactly a snapshot's: files added since are removed, "
        "removed ones come back, contents and modes as they were. Commands still running in "
        "this sandbox are ended first (the result lists them). Only snapshots you took on "
        "this server can be restored."),
        "snapshot", {"type": "string", "description": "the id a snapshot call returned"},
        required=True),
    _declaration("fork", (
        "Open n new sandboxes, each starting from this sandbox's files now and independent of "
        "it and of each other (no running processes are carried). The result lists each "
        "one's handle: pass it as \"sandbox\" to work in that one. To bring a branch's files "
        "back, snapshot it and restore that snapshot here."),
        "n", {"type": "integer", "minimum": 1, "maximum": MOST_HANDLES,
              "description": f"how many sandboxes (1 to {MOST_HANDLES})"},
        required=True),
]

OFF = ("{name}: this server was started without --branching; the snapshot, restore and fork "
       "tools are off (start it with 'toolseam mcp --branching')")

Admit = Callable[[Toolkit, str], Awaitable[Sandbox]]  # a fork's child, as a handle sandbox


def hints(name: str) -> dict[str, bool]:
    """MCP tool hints: a restore destroys what changed since; nothing here is read-only."""
    return {"read_only_hint": False, "destructive_hint": name == "restore",
            "idempotent_hint": False, "open_world_hint": False}


def _error(name: str, message: str, code: str) -> ToolResult:
    return ToolResult(output=f"{name}: {message}", is_error=True, metadata={"error": code})


class Branching:
    """The three tools for one server: which principal took which snapshot."""

    def __init__(self, admit: Admit) -> None:
        self._admit = admit
        self._taken: dict[str, str] = {}  # snapshot id -> the principal it was taken for

    async def call(self, name: str, arguments: dict[str, Any], sandbox: Sandbox,
                   principal: str) -> ToolResult:
        try:
            if name == "snapshot":
                return await self._snapshot(arguments, sandbox, principal)
            if name == "restore":
                return await self._restore(arguments, sandbox, principal)
            return await self._fork(arguments, sandbox, principal)
        except HostError as exc:  # a refused argument, a backend without branching
            return _error(name, str(exc), exc.code)
        except CouldNotRunError as exc:  # a corrupt store entry, a snapshot over its limit
            return could_not_run_result(name, exc)

    async def _snapshot(self, arguments: dict[str, Any], sandbox: Sandbox,
                        principal: str) -> ToolResult:
        label = arguments.get("label")
        if (label is not None and not isinstance(label, str)) or set(arguments) - {"label"}:
            return _error("snapshot", "takes only \"label\", a string", "INVALID_ARGUMENTS")
        snap = await sandbox.toolkit.snapshot(label)
        self._taken[snap.id] = principal
        return ToolResult(output=snapshot_text(snap),
                          metadata={"snapshot": snap.model_dump(mode="json")})

    async def _restore(self, arguments: dict[str, Any], sandbox: Sandbox,
                       principal: str) -> ToolResult:
        chosen = arguments.get("snapshot")
        if not isinstance(chosen, str) or set(arguments) != {"snapshot"}:
            return _error("restore", "takes \"snapshot\": the id a snapshot call returned",
                          "INVALID_ARGUMENTS")
        owner = self._taken.get(chosen)
        if owner is None or not secrets.compare_digest(owner, principal):
            shown = chosen if len(chosen) <= _MOST_ID else chosen[:_MOST_ID] + "…"
            return _error("restore", f"no snapshot {shown!r} of yours on this server: only "
                          "ids a snapshot call of yours returned here can be restored",
                          "UNKNOWN_SNAPSHOT")
        done = await sandbox.toolkit.restore(chosen)
        return ToolResult(output=restore_text(done), metadata={"restore": done.model_dump()})

    async def _fork(self, arguments: dict[str, Any], sandbox: Sandbox,
                    principal: str) -> ToolResult:
        n = arguments.get("n")
        if (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MOST_HANDLES
                or set(arguments) != {"n"}):
            return _error("fork", f"takes \"n\": an integer from 1 to {MOST_HANDLES} (the most "
                          f"sandboxes one client keeps), got {n!r}", "INVALID_ARGUMENTS")
        children: list[dict[str, str]] = []
        for made in await sandbox.toolkit.fork(n):
            if isinstance(made, CouldNotRunError):
                children.append({"error": made.reason})
                continue
            try:
                child = await self._admit(made, principal)
            except HostError as exc:  # no room: this child is closed, the others stay
                await made.close()
                children.append({"error": str(exc)})
                continue
            children.append({"sandbox": child.handle or ""})
        return ToolResult(output=fork_text(children), metadata={"children": children})


def snapshot_text(snap: Snapshot) -> str:
    label = f" ({snap.label})" if snap.label else ""
    left = f" Left out (not regular files, links or directories): {', '.join(snap.left_out)}." \
        if snap.left_out else ""
    return (f"Snapshot {snap.id}{label}: {snap.files} names, {snap.size_bytes} bytes added to "
            f"the store.{left} Running processes are not carried: restore {snap.id} to put the "
            "files back as they are now.")


def restore_text(done: RestoreResult) -> str:
    ended = (f" Ended the running jobs {', '.join(map(str, done.ended_jobs))} first."
             if done.ended_jobs else "")
    return (f"Restored snapshot {done.snapshot}: {done.written} files written, {done.removed} "
            f"names removed.{ended} Processes are not carried by a snapshot.")


def fork_text(children: list[dict[str, str]]) -> str:
    lines = [f"{number}. " + (f"sandbox {child['sandbox']}" if "sandbox" in child
                              else f"could not start: {child['error']}")
             for number, child in enumerate(children, 1)]
    opened = sum("sandbox" in child for child in children)
    return (f"Forked {opened} of {len(children)} sandboxes from this one's files now (no "
            "processes carried). Pass a handle as \"sandbox\" to work in that one:\n"
            + "\n".join(lines))
