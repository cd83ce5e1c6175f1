"""The one error type file operations raise, with a stable code per failure.

Codes cross the wire unchanged; the builtins turn each into the model-facing sentence, so the
wording lives in one place above the seam and every backend reads the same.
"""

from __future__ import annotations

import errno

# code -> meaning (the builtins own the wording shown to the model)
NOT_FOUND = "not_found"
IS_DIRECTORY = "is_directory"
NOT_DIRECTORY = "not_directory"
NOT_REGULAR = "not_regular"
NOT_UTF8 = "not_utf8"
OUTSIDE_BASE = "outside_base"
PERMISSION = "permission"
EXISTS = "exists"
TOO_LARGE = "too_large"
STALE = "stale"
INVALID = "invalid"
BINARY = "binary"
PAST_END = "past_end"
OS_ERROR = "os_error"


class FsError(Exception):
    """A file operation failed for a reason the model can act on (never a sandbox failure)."""

    def __init__(self, code: str, path: str, detail: str = "") -> None:
        super().__init__(f"{code}: {path}" + (f" ({detail})" if detail else ""))
        self.code = code
        self.path = path
        self.detail = detail

    def to_wire(self) -> dict[str, str]:
        return {"code": self.code, "path": self.path, "detail": self.detail}


_ERRNO_CODES = {
    errno.ENOENT: NOT_FOUND,
    errno.EISDIR: IS_DIRECTORY,
    errno.ENOTDIR: NOT_DIRECTORY,
    errno.EACCES: PERMISSION,
    errno.EPERM: PERMISSION,
    errno.EEXIST: EXISTS,
}


def from_os_error(exc: OSError, path: str) -> FsError:
    """Map an OSError to the most specific code; anything unknown keeps its strerror."""
    code = _ERRNO_CODES.get(exc.errno or 0, OS_ERROR)
    return FsError(code, path, exc.strerror or str(exc))
