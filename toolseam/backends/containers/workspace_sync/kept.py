"""A copy's baseline as plain data, kept with a durable agent (``modes/copy.py``) so that
whichever client closes the session last copies back against what was really copied in."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from .policy import Entry
from .tar_sync import WorkspaceCopy


def copy_state(copy: WorkspaceCopy) -> dict[str, Any]:
    return {"limit": copy.limit, "keep_group_write": copy.keep_group_write,
            "baseline": {rel: dataclasses.astuple(entry) for rel, entry in copy.baseline.items()},
            "copies": {rel: [path, list(stamp)] for rel, (path, stamp) in copy.copies.items()}}


def restore_copy(saved: dict[str, Any], workspace: str) -> WorkspaceCopy:
    copy = WorkspaceCopy(workspace, int(saved["limit"]),
                         keep_group_write=bool(saved["keep_group_write"]))
    for rel, (kind, mode, digest, size, stamp) in saved["baseline"].items():
        kind_: Literal["file", "dir", "link"] = kind
        copy.baseline[rel] = Entry(kind_, int(mode), str(digest), int(size),
                                   None if stamp is None else (int(stamp[0]), int(stamp[1])))
    for rel, (path, stamp) in saved["copies"].items():
        copy.copies[rel] = (str(path), (int(stamp[0]), int(stamp[1])))
    return copy
