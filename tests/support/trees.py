"""A directory tree as data, for tests that compare what a restore or fork left with what a
snapshot held: every name (bytes), its kind, mode, and content or link target."""

from __future__ import annotations

import os
import stat
from pathlib import Path

Tree = dict[bytes, tuple[str, int, bytes]]


def describe(root: Path | str, skip_prefix: bytes = b".toolseam-") -> Tree:
    """``{relative name: (kind, permission bits, bytes or link target)}``, links never
    followed; names toolseam works with are left out."""
    found: Tree = {}
    base = os.fsencode(str(root))
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if not d.startswith(skip_prefix)]
        for name in [*dirs, *files]:
            if name.startswith(skip_prefix):
                continue
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, base)
            st = os.lstat(path)
            mode = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                found[rel] = ("link", 0, os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[rel] = ("dir", mode, b"")
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as source:
                    found[rel] = ("file", mode, source.read())
            else:
                found[rel] = ("other", mode, b"")
    return found
