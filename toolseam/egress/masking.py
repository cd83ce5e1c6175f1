"""Credentials never come back: what an upstream answers to a request that carried one is masked
before the sandbox sees it.

An upstream that shows the request it got — an echo endpoint (httpbin's ``/headers``), an error
page quoting the headers, ``TRACE`` — would hand the injected credential straight to the code
the proxy keeps it from. So, for requests the proxy added credentials to: ``TRACE``/``TRACK``
are refused, the upstream is asked for an uncompressed answer (``Accept-Encoding: identity``)
and a compressed one is refused (its bytes cannot be checked), and every occurrence of a
credential value (and of its last word, the token after ``Bearer``) in the status line, the
headers and the body — as sent, and as a JSON string would escape it — is replaced by as many
``*``: the same length, so ``Content-Length`` stays true. The body is masked as a stream,
holding back one value's length less one byte, so a value split across reads is caught; a
chunked body is masked in its decoded bytes and re-chunked.

What it cannot catch: an upstream that transforms what it reflects (base64, a hash, splitting it
with markup). Give credentials only to hosts that do not echo requests (docs/network.md).
"""

from __future__ import annotations

import contextlib
import json

REFUSED_METHODS = frozenset({"TRACE", "TRACK"})


_TOKEN_MIN = 8  # a credential's last word (the token after "Bearer") is masked when this long


def _forms(secret: str) -> set[bytes]:
    texts = {secret}
    token = secret.split()[-1] if secret.split() else ""
    if len(token) >= _TOKEN_MIN:
        texts.add(token)  # a server that echoes the token it parsed from "Bearer TOKEN"
    forms: set[bytes] = set()
    for text in texts:
        forms |= _encodings(text)
    return forms


def _encodings(secret: str) -> set[bytes]:
    escaped = json.dumps(secret)[1:-1]
    forms = {secret.encode("utf-8"), escaped.encode("utf-8")}
    with contextlib.suppress(UnicodeEncodeError):
        forms.add(secret.encode("latin-1"))
    return {form for form in forms if form}


class Masker:
    """A stream filter replacing every form of every secret by ``*`` of the same length."""

    def __init__(self, secrets: list[str]) -> None:
        forms: set[bytes] = set()
        for secret in secrets:
            forms |= _forms(secret)
        self._forms = sorted(forms, key=len, reverse=True)  # the longest first: whole values
        self._keep = max((len(form) for form in self._forms), default=1) - 1
        self._held = b""

    def mask(self, data: bytes) -> bytes:
        """``data`` masked as a whole (a header line, a status line)."""
        for form in self._forms:
            data = data.replace(form, b"*" * len(form))
        return data

    def feed(self, data: bytes) -> bytes:
        """What of the stream so far can be passed on; the rest waits for more."""
        pending = self.mask(self._held + data)
        if len(pending) <= self._keep:
            self._held = pending
            return b""
        cut = len(pending) - self._keep
        self._held = pending[cut:]
        return pending[:cut]

    def flush(self) -> bytes:
        """The end of the stream: what was held back (masked already)."""
        held, self._held = self._held, b""
        return held
