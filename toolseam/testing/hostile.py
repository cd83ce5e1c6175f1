"""``HostileBackend``: wraps any backend and returns its enumerations in a hostile order.

Orders: ``reversed``, ``shuffled`` (seeded), ``hashed`` (by a hash of the name, as ext4's
htree directories hand entries out) and ``duplicated`` (every entry twice, reversed). The
library's listing rule must make the model see byte-identical output whatever this wrapper
does.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Literal

from ..seam.models import FileListing, GlobMatch, GrepListing, PathRef
from ..seam.protocol import BuiltinExec

Order = Literal["reversed", "shuffled", "hashed", "duplicated"]
ORDERS: tuple[Order, ...] = ("reversed", "shuffled", "hashed", "duplicated")


def _hash(path: str) -> bytes:
    return hashlib.sha256(path.encode("utf-8", "surrogatepass")).digest()


class HostileBackend:
    def __init__(self, inner: BuiltinExec, order: Order, seed: int = 0) -> None:
        self._inner = inner
        self.order = order
        self._random = random.Random(seed)
        self.name = f"hostile-{order}({inner.name})"

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._inner, attribute)  # everything but enumeration passes through

    def _reorder(self, items: list[Any], key_of: list[str]) -> list[Any]:
        indexed = list(zip(items, key_of, strict=True))
        if self.order == "reversed":
            indexed.reverse()
        elif self.order == "shuffled":
            self._random.shuffle(indexed)
        elif self.order == "hashed":
            indexed.sort(key=lambda pair: _hash(pair[1]))
        else:
            indexed = (indexed + indexed)[::-1]
        return [item for item, _ in indexed]

    async def list_files(self, ref: PathRef, match: GlobMatch | None = None) -> FileListing:
        listing = await self._inner.list_files(ref, match)
        return listing.model_copy(update={"paths": self._reorder(listing.paths, listing.paths)})

    async def grep(self, ref: PathRef, pattern: str, include: GlobMatch | None = None,
                   deadline_ms: int | None = None) -> GrepListing:
        listing = await self._inner.grep(ref, pattern, include, deadline_ms)
        hits = self._reorder(listing.hits, [f"{h[0]}:{h[1]}" for h in listing.hits])
        return listing.model_copy(update={"hits": hits})
