"""What the Ray streaming tests share (review D1): a streamed command's request in a
sandbox's ``/workspace``, and a command's chunks joined per stream."""

from __future__ import annotations

import uuid
from typing import Any

from toolseam.seam.models import OutputChunk, SpawnRequest

PATH = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


def spawn(command: str, **fields: Any) -> SpawnRequest:
    """``sh -c command`` as a job of its own name, in the sandbox's workspace."""
    return SpawnRequest(job=f"s-{uuid.uuid4().hex[:8]}", argv=["/bin/sh", "-c", command],
                        cwd="/workspace", env=PATH, **fields)


def by_stream(chunks: list[OutputChunk]) -> dict[str, str]:
    """The chunks' text, joined per stream, in their order."""
    return {name: "".join(c.text for c in chunks if c.stream == name)
            for name in ("stdout", "stderr")}
