"""``grep`` and ``glob``: the backend enumerates everything, the listing rule orders and caps."""

from __future__ import annotations

from pydantic import StrictStr

from ..listing import GlobSyntaxError, compile_glob, sort_and_cap
from ..seam.errors import FileOpError
from ..seam.models import GlobMatch
from ._base import Builtin, CallContext, InputModel, ToolResult, WholeFrom1, error, object_schema, ok
from ._spill import ref_for

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
                   "sorted by path then line; at most limit (default 100) matches, and the reply "
                   "says how many there were in all.")
    Input = GrepInput
    schema = object_schema({
        "pattern": ("string", "Python regular expression, matched per line."),
        "path": ("string", "Directory (or file) to search; default: the base dir."),
        "include": ("string", "Only files matching this glob, e.g. '*.py'."),
        "limit": ("integer", "Most matches to return (default 100)."),
    }, ["pattern"], bounds={"limit": (1, None)})

    async def run(self, args: GrepInput, ctx: CallContext) -> ToolResult:
        # The pattern is compiled by the search itself, under its deadline (a pattern can take
        # seconds to compile); one that does not compile comes back as bad_pattern.
        try:
            include = _glob_match(args.include) if args.include is not None else None
        except GlobSyntaxError as exc:
            return error(f"grep: invalid include glob {args.include!r}: {exc}")
        await ctx.services.check_read(self.name, args.path or ".")
        settings = ctx.services.settings
        try:
            listing = await ctx.backend.grep(ref_for(ctx, args.path), args.pattern, include,
                                             deadline_ms=settings.search_timeout_ms)
        except FileOpError as exc:
            if exc.code != "timeout":
                raise
            return error(f"grep: the search took longer than {exc.detail} ms and was stopped; "
                         "a pattern that backtracks (like (a+)+$) or a very large tree can do "
                         "that: narrow the pattern, the path or include")
        hits = listing.hits
        hidden = await ctx.services.hidden_in_search(self.name, args.path or ".",
                                                     {rel for rel, _, _ in hits})
        if hidden:  # each file a search shows is judged on its own too (issue 32)
            hits = [hit for hit in hits if hit[0] not in hidden]
        page = sort_and_cap(hits, args.limit or DEFAULT_LIMIT)
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
        result = ok(output, count=len(page.items), total=page.total, truncated=page.truncated,
                    skippedBinary=listing.binary_files,
                    skippedUnreadable=listing.unreadable_files + listing.unreadable_dirs)
        notes = result.model_hints.notes
        if page.truncated:
            notes.append(f"(showing {len(page.items)} of {page.total} matching lines, sorted by "
                         "path then line; narrow with path, a tighter pattern or include (e.g. "
                         f"'*.py'), or raise limit)")
        elif not page.items and output != NOTHING_FOUND:
            notes.append(NOTHING_FOUND)
        skipped = [f"{n} {what}" for n, what in (
            (listing.binary_files, "binary file" + ("s" if listing.binary_files != 1 else "")),
            (listing.unreadable_files + listing.unreadable_dirs, "unreadable"))
            if n]
        if skipped:
            notes.append(f"(not searched: {', '.join(skipped)})")
        if hidden:
            notes.append(f"(not shown: {len(hidden)} file{'s' if len(hidden) > 1 else ''} the "
                         "read scope keeps out — " + "; ".join(
                             f"{rel}: {why}" for rel, why in sorted(hidden.items())[:5]) + ")")
        return result


class GlobInput(InputModel):
    pattern: StrictStr
    path: StrictStr | None = None
    limit: WholeFrom1 | None = None


class Glob(Builtin[GlobInput]):
    name = "glob"
    description = ("List files matching a glob ('*', '?', '**', '[abc]', '{a,b}'); a pattern "
                   "without '/' matches file names at any depth. Paths are relative to the "
                   "search root, sorted; at most limit (default 100), and the reply says how "
                   "many there were in all. path must be a directory.")
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
        if args.path is not None and args.path not in (".", ""):
            found = await ctx.backend.stat(ctx.ref(args.path))
            if found.kind not in ("dir", "missing"):  # opencode: a file is not a search root
                return error(f"glob: path {args.path} is a {_KIND_WORDS.get(found.kind, found.kind)}"
                             ", not a directory; give the directory to search (read opens a file)")
        listing = await ctx.backend.list_files(ctx.ref(args.path), match)
        page = sort_and_cap(listing.paths, args.limit or DEFAULT_LIMIT)
        output = "\n".join(page.items)
        if not page.items and ctx.services.settings.output_style == "toolseam":
            output = NOTHING_FOUND
        result = ok(output, count=len(page.items), total=page.total,
                    truncated=page.truncated, skippedUnreadable=listing.unreadable_dirs)
        notes = result.model_hints.notes
        if page.truncated:
            notes.append(f"(showing {len(page.items)} of {page.total} matching files, sorted; "
                         "narrow with path or a more specific pattern, or raise limit)")
        elif not page.items and output != NOTHING_FOUND:
            notes.append(NOTHING_FOUND)
        if listing.unreadable_dirs:
            notes.append(f"(not searched: {listing.unreadable_dirs} unreadable "
                         f"director{'y' if listing.unreadable_dirs == 1 else 'ies'})")
        return result


_KIND_WORDS = {"file": "file", "fifo": "named pipe", "other": "special file",
               "symlink": "symbolic link"}
