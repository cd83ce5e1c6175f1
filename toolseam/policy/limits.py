"""What a container sandbox may use: memory, CPUs, processes, network, its /tmp. Applied by the
engine (they show in ``inspect``); the host backend has no engine and refuses them."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_SIZE = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([bkmg]?)$", re.IGNORECASE)
_UNIT = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
MIN_MEMORY = 6 << 20  # docker's own floor


def size_bytes(text: str) -> int:
    """``"256m"`` → bytes (units b, k, m, g; none means bytes)."""
    match = _SIZE.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size like 512m, 2g or 1048576")
    return int(float(match.group(1)) * _UNIT[match.group(2).lower()])


class SandboxLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    memory: str = Field("2g", description="Memory limit, e.g. 256m or 2g (at least 6m).")
    cpus: float | None = Field(None, gt=0, le=1024, description="CPUs, e.g. 0.5; None: no limit.")
    pids: int = Field(1024, ge=8, le=4_194_304, description="Most processes at once.")
    network: Literal["none", "bridge"] = Field("none", description="'none': loopback only.")
    tmpfs_size: str = Field("512m", description="Size of the sandbox's writable /tmp.")

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str) -> str:
        if size_bytes(value) < MIN_MEMORY:
            raise ValueError(f"{value!r} is below the 6m an engine accepts")
        return value

    @field_validator("tmpfs_size")
    @classmethod
    def _tmpfs(cls, value: str) -> str:
        if size_bytes(value) <= 0:
            raise ValueError(f"{value!r} must be more than zero")
        return value

    @property
    def is_default(self) -> bool:
        return self == SandboxLimits()
