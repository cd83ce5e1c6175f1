"""What the raw sandbox API (``raw.py``) and its terminals (``interactive.py``) both check of
their arguments, and a file operation's refusal as the builtin ``OSError`` that fits — apart
from both, so that neither imports the other for them.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping, Sequence

from ..seam.errors import FileOpError


def checked_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """``env`` as a dict; a ``ValueError`` naming a variable that cannot be set."""
    extra = {} if env is None else dict(env)
    for key, value in extra.items():
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise ValueError(f"env: {key!r} is not a valid variable (no '=', no NUL)")
    return extra


def checked_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` as a list; a ``ValueError`` saying what is wrong with it."""
    if isinstance(argv, str | bytes):
        raise ValueError("argv must be a list of strings, not one string (it is never parsed "
                         "by a shell: pass [\"sh\", \"-c\", line] for that)")
    args = list(argv)
    if not args:
        raise ValueError("argv must not be empty")
    for arg in args:
        if not isinstance(arg, str):
            raise ValueError(f"argv holds a {type(arg).__name__}, not a string: {arg!r}")
        if "\0" in arg:
            raise ValueError("argv must not contain a NUL byte")
    if not args[0]:
        raise ValueError("argv[0] must not be empty")
    return args


_OS_ERRORS: dict[str, tuple[type[OSError], int, str]] = {
    "not_found": (FileNotFoundError, errno.ENOENT, "No such file or directory"),
    "is_directory": (IsADirectoryError, errno.EISDIR, "Is a directory"),
    "not_directory": (NotADirectoryError, errno.ENOTDIR, "Not a directory"),
    "permission": (PermissionError, errno.EACCES, "Permission denied"),
    "outside_base": (PermissionError, errno.EACCES, "Outside the base directory"),
}


def os_error(exc: FileOpError, path: str) -> OSError:
    """A file operation's refusal as the builtin ``OSError`` that fits (FileNotFoundError …)."""
    kind, number, text = _OS_ERRORS.get(exc.code, (OSError, errno.EIO, exc.code))
    detail = f" ({exc.detail})" if exc.detail and exc.detail != text else ""
    return kind(number, f"{text}{detail}", path)
