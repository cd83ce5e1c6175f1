"""``HostileBackend``: wraps any backend and returns its enumerations in a hostile order.

Orders: ``reversed``, ``shuffled`` (seeded), ``inode`` (by inode number, as some filesystems
hand entries out) and ``duplicated`` (every entry twice, reversed). The library's listing rule
must make the model see byte-identical output whatever this wrapper does.
"""

from __future__ import annotations

import random
from typing import Any, Literal

from ..seam.models import FileListing, GlobMatch, GrepListing, PathRef
from ..seam.protocol import BuiltinExec

Order = Literal["reversed", "shuffled", "inode", "duplicated"]
ORDERS: tuple[Order, ...] = ("reversed", "shuffled", "inode", "duplicated")


class HostileBackend:
    def __init__(self, inner: BuiltinExec, order: Order, seed: int = 0) -> None:
        self._inner = inner
        self.order = order
        self._random = random.Random(seed)
        self.name = f"hostile-{order}({inner.name})"

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._inner, attribute)  # everything but enumeration passes through

    def _reorder(self, items: list[Any], inode_of: list[int]) -> list[Any]:
        indexed = list(zip(items, inode_of, strict=True))
        if self.order == "reversed":
            indexed.reverse()
        elif self.order == "shuffled":
            self._random.shuffle(indexed)
        elif self.order == "inode":
            indexed.sort(key=lambda pair: pair[1])
        else:
            indexed = (indexed + indexed)[::-1]
        return [item for item, _ in indexed]

    async def list_files(self, ref: PathRef, match: GlobMatch | None = None,
                         with_inodes: bool = False) -> FileListing:
        listing = await self._inner.list_files(ref, match, with_inodes=True)
        inodes = listing.inodes or []
        pairs = self._reorder(list(zip(listing.paths, inodes, strict=True)), inodes)
        return FileListing(paths=[p for p, _ in pairs],
                           inodes=[i for _, i in pairs] if with_inodes else None,
                           unreadable_dirs=listing.unreadable_dirs)

    async def grep(self, ref: PathRef, pattern: str, include: GlobMatch | None = None,
                   deadline_ms: int | None = None) -> GrepListing:
        listing = await self._inner.grep(ref, pattern, include, deadline_ms)
        hits = self._reorder(listing.hits, [h[3] for h in listing.hits])
        return listing.model_copy(update={"hits": hits})
