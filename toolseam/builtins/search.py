"""``grep`` and ``glob``: the backend enumerates everything, the listing rule orders and caps."""

from __future__ import annotations

import re

from pydantic import StrictStr

from ..listing import GlobSyntaxError, compile_glob, sort_and_cap
from ..seam.errors import FileOpError
from ..seam.models import GlobMatch
from ._base import Builtin, CallContext, InputModel, ToolResult, WholeFrom1, error, object_schema, ok

DEFAULT_LIMIT = 100
NOTHING_FOUND = "No files found"  # an empty result in words: an empty string reads as a failure


def _glob_match(pattern: str) -> GlobMatch:
    compiled = compile_glob(pattern)
    return GlobMatch(regex=compiled.regex, basename=compiled.basename,
                     name_suffix=compiled.name_suffix)


class GrepInput(InputModel):
    pattern: StrictStr
    path: StrictStr | None = None
    include: StrictStr | None = None
    limit: WholeFrom1 | None = None


class Grep(Builtin[GrepInput]):
    name = "grep"
    description = ("Search file contents with a Python regular expression. Prints "
                   "'path:line:text' for each matching line, paths relative to the search root, "
                   "sorted by path then line.")
    Input = GrepInput
    schema = object_schema({
        "pattern": ("string", "Python regular expression, matched per line."),
        "path": ("string", "Directory (or file) to search; default: the base dir."),
        "include": ("string", "Only files matching this glob, e.g. '*.py'."),
        "limit": ("integer", "Most matches to return (default 100)."),
    }, ["pattern"], bounds={"limit": (1, None)})

    async def run(self, args: GrepInput, ctx: CallContext) -> ToolResult:
        try:
            re.compile(args.pattern)
        except re.error as exc:
            return error(f"grep: invalid pattern {args.pattern!r}: {exc}")
        try:
            include = _glob_match(args.include) if args.include is not None else None
        except GlobSyntaxError as exc:
            return error(f"grep: invalid include glob {args.include!r}: {exc}")
        await ctx.services.check_read(self.name, args.path or ".")
        settings = ctx.services.settings
        try:
            listing = await ctx.backend.grep(ctx.ref(args.path), args.pattern, include,
                                             deadline_ms=settings.search_timeout_ms)
        except FileOpError as exc:
            if exc.code != "timeout":
                raise
            return error(f"grep: the search took longer than {exc.detail} ms and was stopped; "
                         "a pattern that backtracks (like (a+)+$) or a very large tree can do "
                         "that: narrow the pattern, the path or include")
        page = sort_and_cap(listing.hits, args.limit or DEFAULT_LIMIT)
        cap = settings.line_max_chars
        cut = 0
        lines = []
        for rel, line, text in page.items:
            if len(text) > cap:
                text, cut = text[:cap], cut + 1
            lines.append(f"{rel}:{line}:{text}")
        output = "\n".join(lines)
        if cut:
            output += f"\n\n({cut} matching line{'s' if cut > 1 else ''} cut at {cap} characters)"
        if not page.items and ctx.services.settings.output_style == "toolseam":
            output = NOTHING_FOUND
        return ok(output, count=len(page.items), total=page.total, truncated=page.truncated,
                  skippedBinary=listing.binary_files,
                  skippedUnreadable=listing.unreadable_files + listing.unreadable_dirs)


class GlobInput(InputModel):
    pattern: StrictStr
    path: StrictStr | None = None
    limit: WholeFrom1 | None = None


class Glob(Builtin[GlobInput]):
    name = "glob"
    description = ("List files matching a glob ('*', '?', '**', '[abc]', '{a,b}'); a pattern "
                   "without '/' matches file names at any depth. Paths are relative to the "
                   "search root, sorted.")
    Input = GlobInput
    schema = object_schema({
        "pattern": ("string", "Glob pattern, e.g. '**/*.py'."),
        "path": ("string", "Directory to search; default: the base dir."),
        "limit": ("integer", "Most paths to return (default 100)."),
    }, ["pattern"], bounds={"limit": (1, None)})

    async def run(self, args: GlobInput, ctx: CallContext) -> ToolResult:
        try:
            match = _glob_match(args.pattern)
        except GlobSyntaxError as exc:
            return error(f"glob: invalid pattern {args.pattern!r}: {exc}")
        await ctx.services.check_read(self.name, args.path or ".")
        listing = await ctx.backend.list_files(ctx.ref(args.path), match)
        page = sort_and_cap(listing.paths, args.limit or DEFAULT_LIMIT)
        output = "\n".join(page.items)
        if not page.items and ctx.services.settings.output_style == "toolseam":
            output = NOTHING_FOUND
        return ok(output, count=len(page.items), total=page.total,
                  truncated=page.truncated, skippedUnreadable=listing.unreadable_dirs)
