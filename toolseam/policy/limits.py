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
    network: Literal["none", "bridge", "egress"] = Field("none", description=(
        "'none': loopback only; 'bridge': the engine's network; 'egress': loopback only, and "
        "the hosts egress_allow names through the session's proxy (docs/network.md)."))
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

    @property
    def sets_resources(self) -> bool:
        """Memory, CPUs, processes or /tmp differ from the defaults (what an engine must be
        seen to apply; the network mode is no resource limit)."""
        return self.model_copy(update={"network": "none"}) != SandboxLimits()

    @property
    def engine_network(self) -> str:
        """The network the engine gives the container: in egress mode none at all (the proxy,
        reached over the session's channel, is the only way out)."""
        return "none" if self.network == "egress" else self.network


# Linux refuses one argv string longer than MAX_ARG_STRLEN (32 pages) with E2BIG: a bash
# command rides as one argument of the shell, so a longer one can never start.
MAX_ARG_STRLEN = 32 * 4096 - 1


class InputLimits(BaseModel):
    """Bounds on what a client or a model may send, checked before any work is done: one place
    (``builtins._base``) for every tool argument, so the Python API, ``serve --stdio`` and
    ``toolseam mcp`` refuse the same inputs with the same tool error; and the two bounds of a
    ``serve --stdio`` line, checked before it is parsed. The defaults are far above what a real
    model or client sends."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    command_bytes: int = Field(MAX_ARG_STRLEN, gt=0, le=MAX_ARG_STRLEN, description=(
        "Longest bash command in UTF-8 bytes; the kernel's limit for one argument is the most."))
    pattern_chars: int = Field(16_384, gt=0, description=(
        "Longest grep/glob pattern or include glob (compiling a regex takes about 3.5 s a MB)."))
    path_bytes: int = Field(4096, gt=0, description="Longest path or workdir in UTF-8 bytes.")
    content_bytes: int = Field(16 << 20, gt=0, description=(
        "Longest other text argument (write content, edit strings, patch text) in UTF-8 bytes."))
    line_bytes: int = Field(64 << 20, ge=1024, description=(
        "serve --stdio: longest request line; a longer one is skipped unread and refused."))
    json_depth: int = Field(512, ge=8, le=100_000, description=(
        "serve --stdio: deepest nesting of arrays and objects in a request line."))


# Which limit bounds a tool argument, by its (canonical) name; any other string argument is
# text and takes ``content_bytes``. Path-like names are measured in bytes like the kernel does.
ARGUMENT_LIMITS = {"command": "command_bytes", "pattern": "pattern_chars",
                   "include": "pattern_chars", "path": "path_bytes", "workdir": "path_bytes"}


def oversized(name: str, value: str, limits: InputLimits) -> str | None:
    """The problem with one string argument, or None. Bytes are counted only when the count of
    characters leaves it in doubt (a character is 1 to 4 bytes)."""
    field = ARGUMENT_LIMITS.get(name, "content_bytes")
    limit: int = getattr(limits, field)
    if field == "pattern_chars":
        size = f"{len(value)} characters"
        if len(value) <= limit:
            return None
    elif len(value) * 4 <= limit:
        return None
    elif len(value) > max(limit, 64 << 20):  # too long whatever its bytes: not worth encoding
        size = f"at least {len(value)} bytes"
    else:
        count = len(value.encode("utf-8", "surrogatepass"))
        if count <= limit:
            return None
        size = f"{count} bytes"
    return f"{name} is too long ({size}; the limit is {limit}, input_limits.{field}){_HINTS[field]}"


_HINTS = {
    "command_bytes": ": write the script to a file with the write tool and run that file",
    "pattern_chars": ": search for a shorter pattern, or several in turn",
    "path_bytes": "",
    "content_bytes": ": send the text in smaller pieces (write a part, then edit or append)",
}


# A surrogate that ``surrogateescape`` cannot turn back into a byte: no encoding can carry it to
# a process or a file system. U+DC80..U+DCFF can (a name with undecodable bytes, as a listing
# shows it), so those stay usable.
_NOT_TEXT = re.compile("[\ud800-\udc7f\udd00-\udfff]")


def not_text(name: str, value: str) -> str | None:
    """The problem with a string that holds a lone surrogate no byte stands for, or None."""
    if value.isascii():
        return None
    found = _NOT_TEXT.search(value)
    if found is None:
        return None
    return (f"{name} holds a lone surrogate (U+{ord(found.group()):04X} at character "
            f"{found.start()}), which is not text: send valid Unicode")
