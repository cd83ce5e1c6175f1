"""Sort by the emitted string in plain code-point order, THEN cap (CONTRACT §4).

Python compares ``str`` by code point — not by locale, not by UTF-16 unit — so the built-in
sort is exactly the rule. Duplicates are dropped first: a hostile backend that repeats an entry
must not be able to push a real one past the cap.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

T = TypeVar("T", bound="SupportsRichComparison")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    total: int  # before the cap
    truncated: bool


def sort_and_cap(candidates: Iterable[T], limit: int) -> Page[T]:
    """The whole candidate set, sorted, then the first ``limit``."""
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    # Sorting the list as enumerated (timsort profits from the walk's partial order) costs half
    # of sorting a set's scrambled order; after it, duplicates sit side by side, and comparing
    # neighbours (in C) is cheaper than hashing 20 000 fresh strings into a set.
    ordered = sorted(candidates)
    if any(map(operator.eq, ordered, islice(ordered, 1, None))):
        ordered = list(dict.fromkeys(ordered))
    return Page(ordered[:limit], len(ordered), len(ordered) > limit)
