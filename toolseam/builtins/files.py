"""``read``, ``write`` and ``edit``: point operations through the seam's file part."""

from __future__ import annotations

import base64
import hashlib
import posixpath

from pydantic import StrictBool, StrictStr

from ..seam.errors import FileOpError
from ..seam.models import ChangeSet, WriteOp
from ._base import (
    Builtin,
    CallContext,
    InputModel,
    ToolResult,
    WholeFrom0,
    WholeFrom1,
    error,
    object_schema,
    ok,
)

# extension -> (mime type, content part type)
MEDIA_TYPES = {
    "png": ("image/png", "image"),
    "jpg": ("image/jpeg", "image"),
    "jpeg": ("image/jpeg", "image"),
    "gif": ("image/gif", "image"),
    "webp": ("image/webp", "image"),
    "pdf": ("application/pdf", "file"),
    "mp3": ("audio/mpeg", "audio"),
    "wav": ("audio/wav", "audio"),
}


class ReadInput(InputModel):
    path: StrictStr
    offset: WholeFrom1 | None = None
    limit: WholeFrom0 | None = None


class Read(Builtin[ReadInput]):
    name = "read"
    description = ("Read a file. Text comes back whole, or as the line window offset/limit "
                   "(1-based); images, PDFs and audio come back as a content part.")
    Input = ReadInput
    schema = object_schema({"path": ("string", "File to read; relative paths are against the base dir."),
                      "offset": ("number", "First line to return, counting from 1."),
                      "limit": ("number", "How many lines to return.")}, ["path"])

    async def run(self, args: ReadInput, ctx: CallContext) -> ToolResult:
        await ctx.services.check_read(self.name, args.path)
        cap = ctx.services.settings.read_max_bytes
        _, dot, ext = posixpath.basename(args.path).rpartition(".")
        media = MEDIA_TYPES.get(ext.lower()) if dot else None
        if media is not None:
            return await self._media(args.path, media, cap, ctx)
        try:
            content = await ctx.backend.read_text(ctx.ref(args.path), args.offset, args.limit,
                                                  refuse_above_bytes=cap)
        except FileOpError as exc:
            if exc.code != "too_large":
                raise
            return error(f"read: {args.path} is {exc.detail} bytes, over the {cap}-byte limit for "
                         "a whole-file read; pass offset and limit to read a window of lines")
        return ok(content.text, bytes=content.size)

    async def _media(self, path: str, media: tuple[str, str], cap: int, ctx: CallContext
                     ) -> ToolResult:
        mime, kind = media
        try:
            content = await ctx.backend.read_bytes(ctx.ref(path), refuse_above_bytes=cap)
        except FileOpError as exc:
            if exc.code != "too_large":
                raise
            return error(f"read: {path} is {exc.detail} bytes, over the {cap}-byte limit")
        part = {"type": kind, "mimeType": mime, "name": posixpath.basename(path),
                "data": base64.b64encode(content.data).decode("ascii")}
        result = ok(f"{path} ({mime}, {content.size} bytes)", bytes=content.size, mimeType=mime)
        result.parts = [part]
        return result


class WriteInput(InputModel):
    path: StrictStr
    content: StrictStr


class Write(Builtin[WriteInput]):
    name = "write"
    description = ("Create or replace a file with the given content, creating missing parent "
                   "directories. The file is replaced atomically.")
    Input = WriteInput
    schema = object_schema({"path": ("string", "File to write; relative paths are against the base dir."),
                      "content": ("string", "The complete new content.")}, ["path", "content"])

    async def run(self, args: WriteInput, ctx: CallContext) -> ToolResult:
        try:
            data = args.content.encode("utf-8")
        except UnicodeEncodeError:
            return error("write: content is not valid Unicode (it holds a lone surrogate)")
        result = await ctx.backend.write(ctx.ref(args.path), data)
        return ok(f"Wrote {len(data)} bytes to {args.path}", bytes=len(data), created=result.created)


class EditInput(InputModel):
    path: StrictStr
    oldString: StrictStr
    newString: StrictStr
    replaceAll: StrictBool | None = None


class Edit(Builtin[EditInput]):
    name = "edit"
    description = ("Replace exact text in a file. oldString must occur exactly once unless "
                   "replaceAll is true. Everything outside the replaced text stays byte-for-byte.")
    Input = EditInput
    schema = object_schema({"path": ("string", "File to edit; relative paths are against the base dir."),
                      "oldString": ("string", "The exact text to replace."),
                      "newString": ("string", "The text to put in its place."),
                      "replaceAll": ("boolean", "Replace every occurrence.")},
                     ["path", "oldString", "newString"])

    async def run(self, args: EditInput, ctx: CallContext) -> ToolResult:
        p = args.path
        if args.oldString == "":
            return error("edit: oldString must not be empty")
        if args.oldString == args.newString:
            return error("edit: oldString and newString are the same; nothing would change")
        await ctx.services.check_read(self.name, p)
        ref = ctx.ref(p)
        raw = await ctx.backend.read_bytes(ref, refuse_above_bytes=ctx.services.settings.read_max_bytes)
        try:
            text = raw.data.decode("utf-8")  # no newline translation: CRLF stays CRLF
        except UnicodeDecodeError:
            return error(f"edit: {p} is not valid UTF-8 text")
        old, new = args.oldString, args.newString
        count = text.count(old)
        if count == 0 and "\r\n" in text and "\n" in old and "\r\n" not in old:
            # The model writes "\n"; a CRLF file holds "\r\n". Match and replace in its own style.
            old, new = old.replace("\n", "\r\n"), new.replace("\r\n", "\n").replace("\n", "\r\n")
            count = text.count(old)
        if count == 0:
            return error(f"edit: oldString not found in {p}")
        if count > 1 and not args.replaceAll:
            return error(f"edit: oldString is not unique in {p} ({count} occurrences); use replaceAll")
        try:
            updated = text.replace(old, new) if args.replaceAll else text.replace(old, new, 1)
            data = updated.encode("utf-8")
        except UnicodeEncodeError:
            return error("edit: newString is not valid Unicode (it holds a lone surrogate)")
        expect = hashlib.sha256(raw.data).hexdigest()
        await ctx.backend.commit(ChangeSet(base=ctx.base_dir, confine=ctx.confine,
                                           ops=[WriteOp(path=p, data=data, expect=expect)]))
        n = count if args.replaceAll else 1
        return ok(f"Edited {p} ({n} replacement{'' if n == 1 else 's'})", replacements=n)
