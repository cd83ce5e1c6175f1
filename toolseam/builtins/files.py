"""``read``, ``write`` and ``edit``: point operations through the seam's file part."""

from __future__ import annotations

import base64
import hashlib
import posixpath
import re

from pydantic import StrictBool, StrictStr

from ..listing import sort_and_cap
from ..seam.errors import FileOpError
from ..seam.models import ChangeSet, PageRequest, PathRef, TextPage, WriteOp
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
from ._diagnose import loose, mismatch_notes
from ._occurrences import first_occurrence, occurrences
from ._spill import ref_for

# extension -> (mime type, content part type)
MEDIA_TYPES = {
    "png": ("image/png", "image"),
    "jpg": ("image/jpeg", "image"),
    "jpeg": ("image/jpeg", "image"),
    "gif": ("image/gif", "image"),
    "webp": ("image/webp", "image"),  # the image types models take; opencode reads the
    # others (bmp, tiff, avif …) as text when they are text, and refuses them when binary
    "pdf": ("application/pdf", "file"),
    "mp3": ("audio/mpeg", "audio"),
    "wav": ("audio/wav", "audio"),
}


# Read as binary without looking: archives, objects, executables, office documents.
_BINARY_EXTENSION_LIST = (
    "zip tar gz tgz bz2 xz zst 7z rar jar war class exe dll so dylib o a lib obj bin dat pyc "
    "pyo wasm iso dmg img doc docx xls xlsx ppt pptx odt ods odp sqlite db mp4 mov avi mkv ttf "
    "otf woff woff2 ico psd"
)
BINARY_EXTENSIONS = frozenset(_BINARY_EXTENSION_LIST.split(" "))
DIR_CAP = 1000  # entries a directory read shows


class ReadInput(InputModel):
    ALIASES = {"file_path": "path", "filePath": "path"}
    path: StrictStr
    offset: WholeFrom1 | None = None
    limit: WholeFrom0 | None = None


class Read(Builtin[ReadInput]):
    name = "read"
    description = ("Read a file as numbered lines (up to 2000 lines or 50 KiB per call; offset "
                   "and limit page through longer files; longer lines are cut). Images, PDFs "
                   "and audio come back as an attachment (images known by their content too); "
                   "text that is not UTF-8 is decoded and says how; a directory comes back as "
                   "its sorted entries.")
    Input = ReadInput
    schema = object_schema({"path": ("string", "File to read; relative paths are against the base dir."),
                      "offset": ("integer", "First line to return, counting from 1."),
                      "limit": ("integer", "How many lines to return (default 2000).")}, ["path"],
                           bounds={"offset": (1, None), "limit": (0, None)})

    async def run(self, args: ReadInput, ctx: CallContext) -> ToolResult:
        services = ctx.services
        await services.check_read(self.name, args.path)
        settings = services.settings
        ref = _read_ref(args.path, ctx)
        _, dot, ext = posixpath.basename(args.path).rpartition(".")
        ext = ext.lower() if dot else ""
        media = MEDIA_TYPES.get(ext)
        if media is not None:
            return await self._media(args.path, media, settings.media_max_bytes, ctx)
        if settings.output_style == "toolnexus":
            return await self._raw(args, ctx)
        if ext in BINARY_EXTENSIONS:
            return await self._binary_named(args.path, ext, ref, ctx)
        request = PageRequest(offset=args.offset or 1,
                              limit=settings.read_default_lines if args.limit is None else args.limit,
                              max_bytes=settings.read_page_bytes,
                              max_line_chars=settings.line_max_chars)
        try:
            page = await ctx.backend.read_page(ref, request)
        except FileOpError as exc:
            if exc.code == "is_directory":
                return await self._directory(args.path, ctx)
            if exc.code == "binary":
                return await self._sniffed(args.path, ref, request, ctx)
            if exc.code == "not_utf8":
                return await self._decoded(args.path, ref, request, ctx, None, None)
            if exc.code == "past_end":
                return error(f"read: offset {request.offset} is past the end of {args.path} "
                             f"({exc.detail} lines)")
            raise
        _seen(ctx, args.path)
        result = ok(render_page(page, request, settings.line_max_chars), bytes=page.size,
                    offset=request.offset, lines=len(page.lines), next=page.next,
                    total=page.total, truncated=page.next is not None, cutLines=page.cut)
        result.model_hints.more = (f"read {args.path} with offset and limit for a smaller "
                                   "window of lines")
        return result

    async def _binary_named(self, path: str, ext: str, ref: PathRef, ctx: CallContext
                            ) -> ToolResult:
        """A binary name (``.bin``, ``.dat``, ``.so`` …): an image or PDF inside is still an
        attachment, as opencode looks at the bytes whatever the name; anything else is
        refused by its name."""
        try:
            content = await ctx.backend.read_bytes(
                ref, refuse_above_bytes=ctx.services.settings.media_max_bytes)
        except FileOpError as exc:
            if exc.code == "is_directory":
                return await self._directory(path, ctx)
            if exc.code != "too_large":
                raise
        else:
            kind = sniff(content.data)
            if kind in MEDIA_TYPES:
                return _media_result(path, MEDIA_TYPES[kind], content.data, content.size)
        return error(f"read: {path} is a binary file (.{ext}); it cannot be read as text")

    async def _sniffed(self, path: str, ref: PathRef, request: PageRequest, ctx: CallContext
                       ) -> ToolResult:
        """A file with NUL bytes: an image or PDF by its content (opencode's rule: the bytes,
        not only the name), UTF-16/32 text by its byte-order mark, else refused naming what
        it looks like."""
        settings = ctx.services.settings
        try:
            content = await ctx.backend.read_bytes(ref, refuse_above_bytes=settings.media_max_bytes)
        except FileOpError as exc:
            if exc.code != "too_large":
                raise
            return error(f"read: {path} is a binary file (it holds NUL bytes); it cannot be "
                         "read as text")
        kind = sniff(content.data)
        if kind in MEDIA_TYPES:
            return _media_result(path, MEDIA_TYPES[kind], content.data, content.size)
        if kind in TEXT_BOMS:
            return await self._decoded(path, ref, request, ctx, content.data, TEXT_BOMS[kind])
        what = BINARY_KINDS.get(kind or "", "it holds NUL bytes")
        return error(f"read: {path} is a binary file ({what}); it cannot be read as text",
                     binaryType=kind or "unknown")

    async def _decoded(self, path: str, ref: PathRef, request: PageRequest, ctx: CallContext,
                       data: bytes | None, encoding: str | None) -> ToolResult:
        """Text that is not UTF-8: decoded with the detected encoding (latin-1 when none is
        detected: every byte is a character there), paged as read pages UTF-8, and said."""
        settings = ctx.services.settings
        if data is None:
            try:
                raw = await ctx.backend.read_bytes(ref, refuse_above_bytes=settings.read_max_bytes)
            except FileOpError as exc:
                if exc.code != "too_large":
                    raise
                return error(f"read: {path} is not valid UTF-8 text and is {exc.detail} bytes, "
                             f"over the {settings.read_max_bytes}-byte limit for decoding it")
            data = raw.data
            kind = sniff(data)  # an image or archive without NUL bytes early on
            if kind in MEDIA_TYPES and len(data) <= settings.media_max_bytes:
                return _media_result(path, MEDIA_TYPES[kind], data, len(data))
            if kind in BINARY_KINDS:
                return error(f"read: {path} is a binary file ({BINARY_KINDS[kind]}); it cannot "
                             "be read as text", binaryType=kind)
            if kind in TEXT_BOMS:
                encoding = TEXT_BOMS[kind]
        if encoding is None:
            encoding = detect_encoding(data)
        text = data.decode(encoding, errors="replace").removeprefix("\ufeff")
        page = page_text(text, request, len(data))
        if page is None:
            total = len(split_text_lines(text))
            return error(f"read: offset {request.offset} is past the end of {path} ({total} lines)")
        _seen(ctx, path)
        body = render_page(page, request, settings.line_max_chars)
        note = f"(the file is not UTF-8: decoded as {encoding})"
        return ok(f"{body}\n{note}", bytes=len(data), offset=request.offset,
                  lines=len(page.lines), next=page.next, total=page.total,
                  truncated=page.next is not None, cutLines=page.cut, encoding=encoding)

    async def _raw(self, args: ReadInput, ctx: CallContext) -> ToolResult:
        """toolnexus's read: raw text, whole or as the line window."""
        cap = ctx.services.settings.read_max_bytes
        try:
            content = await ctx.backend.read_text(_read_ref(args.path, ctx), args.offset, args.limit,
                                                  refuse_above_bytes=cap)
        except FileOpError as exc:
            if exc.code != "too_large":
                raise
            if args.offset is not None or args.limit is not None:
                return error(f"read: that window of {args.path} holds more than the {cap}-character "
                             "limit; ask for fewer lines")
            return error(f"read: {args.path} is {exc.detail} bytes, over the {cap}-byte limit for "
                         "a whole-file read; pass offset and limit to read a window of lines")
        _seen(ctx, args.path)
        return ok(content.text, bytes=content.size)

    async def _directory(self, path: str, ctx: CallContext) -> ToolResult:
        listing = await ctx.backend.list_dir(ctx.ref(path), DIR_CAP)
        page = sort_and_cap(listing.entries, DIR_CAP)
        lines = "\n".join(page.items)
        more = listing.total - len(page.items)
        note = f"\n\n({more} more entries not shown)" if more > 0 else ""
        body = lines + note if page.items else "(empty directory)"
        return ok(f"{path} is a directory:\n{body}", directory=True, entries=listing.total,
                  truncated=more > 0)

    async def _media(self, path: str, media: tuple[str, str], cap: int, ctx: CallContext
                     ) -> ToolResult:
        try:
            content = await ctx.backend.read_bytes(_read_ref(path, ctx), refuse_above_bytes=cap)
        except FileOpError as exc:
            if exc.code != "too_large":
                raise
            return error(f"read: {path} is {exc.detail} bytes, over the {cap}-byte limit")
        return _media_result(path, media, content.data, content.size)


def _media_result(path: str, media: tuple[str, str], data: bytes, size: int) -> ToolResult:
    mime, kind = media
    part = {"type": kind, "mimeType": mime, "name": posixpath.basename(path),
            "data": base64.b64encode(data).decode("ascii")}
    result = ok(f"{path} ({mime}, {size} bytes)", bytes=size, mimeType=mime)
    result.parts = [part]
    return result


def _read_ref(path: str, ctx: CallContext) -> PathRef:
    return ref_for(ctx, path)


# Content signatures (the first bytes). Images a model can take come back as images, whatever
# the file is called; bmp and tiff are images no model takes: refused as binary, named.
_SIGNATURES: tuple[tuple[bytes, int, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", 0, "png"), (b"\xff\xd8\xff", 0, "jpeg"), (b"GIF87a", 0, "gif"),
    (b"GIF89a", 0, "gif"), (b"WEBP", 8, "webp"), (b"%PDF-", 0, "pdf"),
    (b"\xef\xbb\xbf", 0, "utf-8-bom"), (b"\xff\xfe\x00\x00", 0, "utf-32-le"),
    (b"\x00\x00\xfe\xff", 0, "utf-32-be"), (b"\xff\xfe", 0, "utf-16-le"),
    (b"\xfe\xff", 0, "utf-16-be"), (b"II*\x00", 0, "tiff"),
    (b"MM\x00*", 0, "tiff"), (b"PK\x03\x04", 0, "zip"), (b"\x1f\x8b", 0, "gzip"),
    (b"\x7fELF", 0, "elf"), (b"SQLite format 3\x00", 0, "sqlite"),
)
TEXT_BOMS = {"utf-8-bom": "utf-8", "utf-32-le": "utf-32", "utf-32-be": "utf-32",
             "utf-16-le": "utf-16", "utf-16-be": "utf-16"}
BINARY_KINDS = {"zip": "a ZIP archive", "bmp": "a BMP image, not a type a model takes",
                "tiff": "a TIFF image, not a type a model takes",
                "gzip": "gzip data", "elf": "an ELF executable", "sqlite": "an SQLite database"}


def sniff(data: bytes) -> str | None:
    """What the first bytes say the content is (a key of MEDIA_TYPES, TEXT_BOMS or
    BINARY_KINDS), or None."""
    for magic, at, kind in _SIGNATURES:
        if data[at:at + len(magic)] == magic and (kind != "webp" or data[:4] == b"RIFF"):
            return kind
    if data[:2] == b"BM" and data[6:10] == b"\x00\x00\x00\x00" and len(data) >= 26:
        return "bmp"  # "BM" alone starts text too: the header's reserved zeros must follow
    return None


# Multi-byte encodings have structure a detector can check; a single-byte one is a guess from
# letter frequencies that short text gets wrong (charset-normalizer calls "café" cp1006).
_MULTIBYTE = frozenset({"cp932", "shift_jis", "shift_jis_2004", "shift_jisx0213", "euc_jp",
                        "euc_jis_2004", "euc_jisx0213", "iso2022_jp", "gb18030", "gb2312",
                        "gbk", "hz", "big5", "big5hkscs", "cp950", "euc_kr", "cp949", "johab",
                        "iso2022_kr"})


def detect_encoding(data: bytes) -> str:
    """A multi-byte encoding charset-normalizer detects (when it is installed); else cp1252
    when every byte is defined there (Windows' Western text), else latin-1, which decodes
    every byte."""
    try:
        from charset_normalizer import from_bytes
    except ImportError:
        best = None
    else:
        best = from_bytes(data[:1 << 20]).best()
    if best is not None and best.encoding in _MULTIBYTE:
        return best.encoding.replace("_", "-")
    try:
        data.decode("cp1252")
    except UnicodeDecodeError:
        return "latin-1"
    return "cp1252"


def split_text_lines(text: str) -> list[str]:
    """Lines as read_page sees them: split at LF, a CR before it dropped, no final empty line."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def page_text(text: str, request: PageRequest, size: int) -> TextPage | None:
    """The page ``read_page`` would give for this text; None when offset is past the end."""
    lines = split_text_lines(text)
    start = request.offset - 1
    if start > len(lines) or (start == len(lines) and lines):
        return None
    out: list[str] = []
    cut: list[int] = []
    used = 0
    for number in range(start + 1, len(lines) + 1):
        line = lines[number - 1]
        if len(out) >= request.limit or (out and used + len(line.encode()) + 1 > request.max_bytes):
            return TextPage(lines=out, cut=cut, next=number, total=None, size=size)
        if len(line) > request.max_line_chars:
            line = line[:request.max_line_chars]
            cut.append(number)
        out.append(line)
        used += len(line.encode()) + 1
    return TextPage(lines=out, cut=cut, next=None, total=len(lines), size=size)


def _seen(ctx: CallContext, path: str) -> None:
    """The model has seen this file's content: a guarded write may replace it (tracked only
    when the guard is on — it costs a path join per call)."""
    if ctx.services.settings.write_requires_read:
        ctx.services.note_read(ctx.absolute(path))


def _size_label(size: int) -> str:
    """50 KB for 51,200 bytes, as opencode says it."""
    return f"{size // 1024} KB" if size % 1024 == 0 else f"{size} bytes"


def render_page(page: TextPage, request: PageRequest, max_line_chars: int) -> str:
    """Numbered lines (``00042| text``, as opencode numbers them) and a footer that says what
    is left: the offset to read on from (in opencode's words when the byte cap ended the
    page), or where the file ends."""
    offset = request.offset
    lines = page.lines
    if lines and offset == 1:
        lines = [lines[0].removeprefix("\ufeff"), *lines[1:]]  # the BOM is not text
    body = "\n".join(f"{n:05d}| {text}" for n, text in enumerate(lines, offset))
    if page.total == 0:
        return "(empty file)"
    notes = []
    if page.cut:
        shown = ", ".join(map(str, page.cut[:10])) + (" …" if len(page.cut) > 10 else "")
        notes.append(f"(line {shown} cut at {max_line_chars} characters)" if len(page.cut) == 1
                     else f"(lines {shown} cut at {max_line_chars} characters each)")
    if page.next is not None and len(lines) < request.limit:
        last = offset + len(lines) - 1
        notes.append(f"(Output capped at {_size_label(request.max_bytes)}. Showing lines "
                     f"{offset}-{last}. Use offset={page.next} to continue.)")
    elif page.next is not None:
        last = offset + len(lines) - 1
        notes.append(f"(showing lines {offset}-{last}; the file has more: read on with "
                     f"offset={page.next})")
    else:
        notes.append(f"(end of file, {page.total} line{'' if page.total == 1 else 's'})")
    return body + ("\n\n" if body else "") + "\n".join(notes)


class WriteInput(InputModel):
    ALIASES = {"file_path": "path", "filePath": "path"}
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
        ref = ctx.ref(args.path)
        services = ctx.services
        guarded = services.settings.write_requires_read
        if guarded and not services.has_read(ctx.absolute(args.path)):
            existing = await ctx.backend.stat(ref)
            if existing.kind != "missing":
                return error(f"write: {args.path} already exists and was not read in this "
                             "session; read it first, then write")
        result = await ctx.backend.write(ref, data, keep_bom=True)
        ctx.note_written(len(data))
        _seen(ctx, args.path)  # the model knows what it wrote
        return ok(f"Wrote {len(data)} bytes to {args.path}", bytes=len(data), created=result.created)


class EditInput(InputModel):
    ALIASES = {"file_path": "path", "filePath": "path", "old_string": "oldString",
               "new_string": "newString", "replace_all": "replaceAll"}
    path: StrictStr
    oldString: StrictStr
    newString: StrictStr
    replaceAll: StrictBool | None = None


BOM = "\ufeff"


class Edit(Builtin[EditInput]):
    name = "edit"
    description = ("Replace exact text in a file. oldString must occur exactly once unless "
                   "replaceAll is true; it matches whatever the file's line endings, and the "
                   "new text is written in the file's own. An empty oldString creates the "
                   "file, or replaces a whole existing one. Everything outside the replaced "
                   "text stays byte-for-byte.")
    Input = EditInput
    schema = object_schema({"path": ("string", "File to edit; relative paths are against the base dir."),
                      "oldString": ("string", "The exact text to replace."),
                      "newString": ("string", "The text to put in its place."),
                      "replaceAll": ("boolean", "Replace every occurrence.")},
                     ["path", "oldString", "newString"])

    async def run(self, args: EditInput, ctx: CallContext) -> ToolResult:
        p = args.path
        if args.oldString == args.newString:
            return error("edit: oldString and newString are the same; nothing would change")
        await ctx.services.check_read(self.name, p)
        ref = ctx.ref(p)
        if args.oldString == "":
            return await self._create(args, ctx)
        raw = await ctx.backend.read_bytes(ref, refuse_above_bytes=ctx.services.settings.read_max_bytes)
        try:
            text = raw.data.decode("utf-8")  # no newline translation: CRLF stays CRLF
        except UnicodeDecodeError:
            return error(f"edit: {p} is not valid UTF-8 text")
        bom = BOM if text.startswith(BOM) else ""
        text = text.removeprefix(bom)
        matches = occurrences(text, args.oldString)
        if not matches:
            failed = error(f"edit: oldString not found in {p}")
            failed.model_hints.notes.extend(_not_found_notes(text, args.oldString, args.newString))
            return failed
        if len(matches) > 1 and not args.replaceAll:
            failed = error(f"edit: oldString is not unique in {p} ({len(matches)} occurrences); "
                           "use replaceAll")
            numbers = [text.count("\n", 0, start) + 1 for start, _ in matches[:21]]
            shown = ", ".join(map(str, numbers[:20])) + (" …" if len(numbers) > 20 else "")
            failed.model_hints.notes.append(
                f"(it occurs at lines {shown}; add surrounding lines to oldString to pick one, "
                "or set replaceAll to change them all)")
            return failed
        chosen = matches if args.replaceAll else matches[:1]
        pieces: list[str] = []
        last = 0
        for start, end in chosen:
            pieces += [text[last:start], _in_style(args.newString, text[start:end], text)]
            last = end
        try:
            data = (bom + "".join(pieces) + text[last:]).encode("utf-8")
        except UnicodeEncodeError:
            return error("edit: newString is not valid Unicode (it holds a lone surrogate)")
        expect = hashlib.sha256(raw.data).hexdigest()
        await ctx.backend.commit(ChangeSet(base=ctx.base_dir, confine=ctx.confine,
                                           ops=[WriteOp(path=p, data=data, expect=expect)]))
        ctx.note_written(len(data))
        _seen(ctx, p)
        n = len(chosen)
        return ok(f"Edited {p} ({n} replacement{'' if n == 1 else 's'})", replacements=n)

    async def _create(self, args: EditInput, ctx: CallContext) -> ToolResult:
        """An empty oldString stands for the whole file, as in opencode: a missing file is
        created (parents too), an existing one gets ``newString`` as its whole content — its
        UTF-8 byte-order mark kept, as every edit keeps it (decision 357)."""
        try:
            data = args.newString.encode("utf-8")
        except UnicodeEncodeError:
            return error("edit: newString is not valid Unicode (it holds a lone surrogate)")
        ref = ctx.ref(args.path)
        existing = await ctx.backend.stat(ref)
        if existing.kind not in ("missing", "file"):
            return error(f"edit: {args.path} is not a regular file ({existing.kind})")
        if existing.kind == "missing":
            await ctx.backend.commit(ChangeSet(base=ctx.base_dir, confine=ctx.confine, ops=[
                WriteOp(path=args.path, data=data, expect="absent")]))
            ctx.note_written(len(data))
            _seen(ctx, args.path)
            return ok(f"Created {args.path} ({len(data)} bytes)", replacements=0, created=True)
        services = ctx.services
        if services.settings.write_requires_read and not services.has_read(ctx.absolute(args.path)):
            return error(f"edit: {args.path} already exists and was not read in this session; "
                         "read it first, then replace it")  # as write's guard: a whole file
        raw = await ctx.backend.read_bytes(ref, refuse_above_bytes=services.settings.read_max_bytes)
        bom = BOM.encode() if raw.data.startswith(BOM.encode()) else b""
        data = bom + data.removeprefix(BOM.encode()) if bom else data
        await ctx.backend.commit(ChangeSet(base=ctx.base_dir, confine=ctx.confine, ops=[
            WriteOp(path=args.path, data=data, expect=hashlib.sha256(raw.data).hexdigest())]))
        ctx.note_written(len(data))
        _seen(ctx, args.path)
        if not raw.data.removeprefix(bom):
            return ok(f"Created {args.path} ({len(data)} bytes)", replacements=0, created=False)
        return ok(f"Replaced the whole content of {args.path} ({len(data)} bytes): an empty "
                  "oldString stands for the whole file", replacements=1, created=False)


def _not_found_notes(text: str, old: str, new: str) -> list[str]:
    """Why oldString is not in the file: already replaced, or its nearest miss."""
    done = first_occurrence(text, new) if new else None
    if done is not None:
        at = text.count("\n", 0, done) + 1
        return [f"newString is already in the file (line {at}) and oldString is not: the "
                "edit looks already applied. Read the file before editing again."]
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    wanted = old.replace("\r\n", "\n").split("\n")
    if len(wanted) == 1:
        # A fragment of a line: the line holding it with spacing and punctuation loosened.
        key = loose(wanted[0])
        for number, candidate in enumerate(lines, 1):
            if key and key in loose(candidate):
                return [f"Closest candidate: line {number}: {candidate.strip()[:120]!r} holds it when "
                        "spacing and typographic quotes/dashes are ignored — the difference is "
                        "whitespace or punctuation; copy the text exactly as read shows it."]
    return mismatch_notes(lines, wanted, 0, "oldString")


def _in_style(new: str, matched: str, text: str) -> str:
    """``new`` with the line endings of the text it replaces: its k-th line break takes the
    style of the k-th break replaced (the last one's past them, the file's when none)."""
    lines = new.replace("\r\n", "\n").split("\n")
    if len(lines) == 1:
        return new
    styles = re.findall(r"\r?\n", matched)
    if not styles:
        styles = ["\r\n" if text.count("\r\n") * 2 > text.count("\n") else "\n"]
    out = [lines[0]]
    for k, line in enumerate(lines[1:]):
        out += [styles[min(k, len(styles) - 1)], line]
    return "".join(out)
