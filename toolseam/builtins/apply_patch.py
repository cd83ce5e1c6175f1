"""``apply_patch``: verify every section against the files, then commit all or nothing."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

from pydantic import StrictStr

from ..seam.errors import FileOpError
from ..seam.models import ChangeOp, ChangeSet, DeleteOp, WriteOp
from ._base import Builtin, CallContext, InputModel, ToolResult, error, object_schema, ok
from .patch import Hunk, PatchError, apply_hunks, parse_patch


class ApplyPatchInput(InputModel):
    patchText: StrictStr


@dataclass
class _File:
    """One path the patch touches: what is on disk, and what the patch makes of it."""

    display: str
    original: bytes | None  # None: absent
    current: str | None


class ApplyPatch(Builtin[ApplyPatchInput]):
    name = "apply_patch"
    description = ("Apply a patch in the '*** Begin Patch' format (Add File, Update File with "
                   "optional Move to, Delete File), as codex's apply_patch takes it (a heredoc "
                   "wrapper is accepted). Either every file operation applies, or none.")
    Input = ApplyPatchInput
    schema = object_schema({"patchText": ("string", "The whole patch, Begin to End Patch.")},
                           ["patchText"])

    async def run(self, args: ApplyPatchInput, ctx: CallContext) -> ToolResult:
        try:
            ops = parse_patch(args.patchText)
        except PatchError as exc:
            return error(f"apply_patch: {exc}")
        files: dict[str, _File] = {}

        async def load(path: str) -> _File:
            key = ctx.absolute(path)
            if key not in files:
                files[key] = await _load(path, ctx)
            return files[key]

        counts = {"added": 0, "updated": 0, "deleted": 0, "moved": 0}
        try:
            for op in ops:
                target = await load(op.path)
                if op.kind == "add":  # over an existing file: replaced, as codex and opencode do
                    target.current = op.content
                    counts["added"] += 1
                elif op.kind == "delete":
                    if target.current is None:
                        raise PatchError(f"Delete File: {op.path} does not exist")
                    target.current = None
                    counts["deleted"] += 1
                else:
                    if target.current is None:
                        raise PatchError(f"Update File: {op.path} does not exist")
                    updated = await _apply(target.current, op.hunks, op.path)
                    counts["updated"] += 1
                    if op.move_to is None:
                        target.current = updated
                        continue
                    destination = await load(op.move_to)
                    if destination is not target:  # an existing destination is replaced
                        target.current = None
                    destination.current = updated
                    counts["moved"] += 1
        except PatchError as exc:
            failed = error(f"apply_patch: {exc}")
            failed.model_hints.notes.extend(exc.notes)
            if exc.notes:
                failed.model_hints.notes.append("Nothing was changed: fix that hunk and send the "
                                                "whole patch again.")
            return failed
        except _NotText as exc:
            return error(f"apply_patch: {exc.path} is not valid UTF-8 text")
        change = [item for f in files.values() if (item := _change(f)) is not None]
        if change:
            await ctx.backend.commit(ChangeSet(base=ctx.base_dir, confine=ctx.confine, ops=change))
            ctx.note_written(sum(len(op.data) for op in change if isinstance(op, WriteOp)))
        n = len(ops)
        return ok(f"Applied patch: {n} file operation{'' if n == 1 else 's'}", **counts)


class _NotText(Exception):
    def __init__(self, path: str) -> None:
        self.path = path


async def _load(path: str, ctx: CallContext) -> _File:
    await ctx.services.check_read("apply_patch", path)
    try:
        raw = await ctx.backend.read_bytes(ctx.ref(path),
                                           refuse_above_bytes=ctx.services.settings.read_max_bytes)
    except FileOpError as exc:
        if exc.code == "not_found":
            return _File(path, None, None)
        raise
    try:
        return _File(path, raw.data, raw.data.decode("utf-8"))
    except UnicodeDecodeError:
        raise _NotText(path) from None


def _change(f: _File) -> ChangeOp | None:
    """The commit op for one path, with the precondition that nothing changed meanwhile."""
    if f.original is None:
        return None if f.current is None else WriteOp(path=f.display, data=f.current.encode(),
                                                       expect="absent")
    expect = hashlib.sha256(f.original).hexdigest()
    if f.current is None:
        return DeleteOp(path=f.display, expect=expect)
    data = f.current.encode()
    return None if data == f.original else WriteOp(path=f.display, data=data, expect=expect)


_THREAD_ABOVE = 256 << 10  # characters: a bigger file is matched off the event loop


async def _apply(content: str, hunks: list[Hunk], path: str) -> str:
    """The hunks applied; a big file in a thread, so that a hostile hunk against it (linear
    now, but seconds on a file of millions of lines) cannot hold up other sessions' calls on
    this event loop."""
    if len(content) <= _THREAD_ABOVE:
        return apply_hunks(content, hunks, path)
    return await asyncio.to_thread(apply_hunks, content, hunks, path)

