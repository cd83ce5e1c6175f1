"""The agent's file operations by wire name: the one table the server dispatches on and the host
runs in-process (``toolseam/backends/agentlink/ops.py`` names the same rows with their seam
result models). A new file operation is one row here and one row there.

Each function takes the request's arguments as keywords (bytes already decoded) and returns a
JSON-able dict (bytes values are sent base64 under ``<key>_b64``); an ``FsError`` is the
model-facing failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import files, walk

FILE_OPS: dict[str, Callable[..., dict[str, Any]]] = {
    "stat": files.stat_path,
    "read_text": files.read_text,
    "read_bytes": files.read_bytes,
    "read_page": files.read_page,
    "list_dir": files.list_dir,
    "write": files.write_file,
    "commit": files.commit,
    "list_files": walk.list_files,
}

# The same walks step by step, for a host that runs them on its event loop in slices.
STEPWISE: dict[str, Callable[..., walk.Steps]] = {
    "list_files": walk.list_files_steps,
}

# Bounded by their caps: the server answers them on its loop (a thread hand-off costs more).
INLINE = frozenset({"stat", "write", "read_page"})
