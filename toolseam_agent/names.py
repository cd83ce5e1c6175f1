"""How a file name is shown: the one display form both ``files`` and ``walk`` use (a module
of its own, so neither imports the other for it)."""

from __future__ import annotations


def escape_name(name: str) -> str:
    r"""The one display form of a file name: undecodable bytes become ``\xNN``.

    ``os.scandir`` hands back names with undecodable bytes as lone surrogates
    (``surrogateescape``); those can cross neither JSON strictly nor a model's context.
    """
    if name.isascii():
        return name
    try:
        name.encode("utf-8")
        return name
    except UnicodeEncodeError:
        return "".join(f"\\x{ord(c) - 0xDC00:02x}" if 0xDC80 <= ord(c) <= 0xDCFF else c
                       for c in name)
