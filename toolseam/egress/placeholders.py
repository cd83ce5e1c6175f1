"""Placeholder credentials: a value of the real credential's shape that the sandbox may hold.

Tools such as ``gh``, ``npm`` or an SDK refuse to start without a token in their environment.
With ``egress_credentials[].placeholder_env``, the sandbox gets a random stand-in: the real
value's prefix (``ghp_``, ``sk-ant-``, ``xoxb-``: letters up to the last ``_`` or ``-`` of the
first 12 characters) kept, every other character replaced by a random one of the same class
(digit, lower, upper, or kept as is), so the length and alphabet a tool checks are the real
one's. The proxy swaps it for the real value on the way to the bound host only; anywhere else
it is refused (``relay.py``). Same length matters: a swap in a body leaves ``Content-Length``
and chunk sizes true.
"""

from __future__ import annotations

import re
import secrets
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass

_PREFIX = re.compile(r"^[A-Za-z0-9]{1,10}[_-]")
WHERE = ("header", "url", "body")


def shaped_like(value: str) -> str:
    """A random value of ``value``'s shape (see the module docstring); never equal to it.
    ValueError for a value with no letter or digit to change (no stand-in could differ)."""
    prefix = _PREFIX.match(value)
    kept = prefix.group(0) if prefix else ""
    if not any(ch.isascii() and ch.isalnum() for ch in value[len(kept):]):
        kept = ""  # the rest is punctuation alone: the prefix's characters are changed too
    if not any(ch.isascii() and ch.isalnum() for ch in value):
        raise ValueError("the value has no letter or digit, so no stand-in of its shape differs")
    while True:  # ends: at least one character is drawn from 10 or more
        body = "".join(_same_class(ch) for ch in value[len(kept):])
        made = kept + body
        if made != value and (not body or body != value[len(kept):]):
            return made


def _same_class(ch: str) -> str:
    for alphabet in (string.digits, string.ascii_lowercase, string.ascii_uppercase):
        if ch in alphabet:
            return secrets.choice(alphabet)
    return ch  # punctuation stays: a tool may split on it


@dataclass(frozen=True)
class Placeholder:
    """One credential's stand-in, the real value it stands for, and where it is swapped."""

    host: str
    header: str
    env: str
    fake: str
    value: str
    where: frozenset[str]

    def __repr__(self) -> str:  # the real value is a secret
        return f"Placeholder(host={self.host!r}, header={self.header!r}, env={self.env!r})"


class Scanner:
    """Finds any of ``needles`` in a stream fed in pieces (a needle may straddle two)."""

    def __init__(self, needles: Iterable[str]) -> None:
        self._needles = [n.encode() for n in needles if n]
        self._keep = max((len(n) for n in self._needles), default=1) - 1
        self._tail = b""

    def __bool__(self) -> bool:
        return bool(self._needles)

    def seen(self, data: bytes) -> bool:
        window = self._tail + data
        found = any(needle in window for needle in self._needles)
        self._tail = window[-self._keep:] if self._keep else b""
        return found


class Swapper:
    """A request body's filter (``http1.relay_body``'s ``masker``): each placeholder bound to
    this host replaced by its real value, and ``on_foreign`` called (nothing more passed) when
    a placeholder bound elsewhere shows up. Stand-in and value are the same length, so offsets
    stay true; up to a placeholder's length less one byte waits for the next piece."""

    def __init__(self, pairs: Iterable[tuple[str, str]], foreign: Iterable[str] = (),
                 on_foreign: Callable[[], None] = lambda: None) -> None:
        self._pairs = [(fake.encode(), real.encode()) for fake, real in pairs]
        self._foreign = [fake.encode() for fake in foreign]
        self._on_foreign = on_foreign
        self._keep = max((len(f) for f in [*(f for f, _ in self._pairs), *self._foreign]),
                         default=1) - 1
        self._held = b""
        self.refused = False

    def mask(self, data: bytes) -> bytes:
        """A whole piece (a chunked body's trailer line)."""
        return self.feed(data) + self.flush()

    def feed(self, data: bytes) -> bytes:
        if self.refused:
            return b""
        window = self._held + data
        if any(fake in window for fake in self._foreign):
            self.refused, self._held = True, b""
            self._on_foreign()
            return b""
        for fake, real in self._pairs:
            window = window.replace(fake, real)
        if self._keep and len(window) > self._keep:
            window, self._held = window[:-self._keep], window[-self._keep:]
        elif self._keep:
            window, self._held = b"", window
        return window

    def flush(self) -> bytes:
        held, self._held = self._held, b""
        return held
