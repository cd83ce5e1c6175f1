"""THE op table: every file operation of the seam, once — its wire name (a row of
``toolseam_agent/ops.py``), the seam model its result is, and how the host backend runs it
in-process. ``parts.py`` drives both file parts from these rows; bytes cross the channel as
base64 under ``<key>_b64`` (both directions, generically), so a row names no byte fields.

Adding a file operation: one row in ``toolseam_agent/ops.py``, one row here, one seam method
(``seam/protocol.py``) whose body in ``parts.FileMethods`` builds the row's arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from toolseam_agent import ops as agent_ops
from toolseam_agent import walk as agent_walk
from toolseam_agent.wire import GREP

from ...seam.models import (
    ByteContent,
    CommitResult,
    DirListing,
    FileListing,
    FileStat,
    GrepListing,
    TextContent,
    TextPage,
    WriteResult,
)

M = TypeVar("M", bound=BaseModel)

# How the host backend runs an operation: its function called here and the result validated
# ("call"); its walk stepped on the event loop and the listing trusted as built ("walk"); or
# sent to the session's agent even on the host ("agent": a regex can backtrack for hours
# holding the interpreter lock — the agent searches in a process it can kill).
InProcess = Literal["call", "walk", "agent"]


@dataclass(frozen=True, slots=True)
class FileOp(Generic[M]):
    """One file operation: what crosses the wire and what the seam gets back."""

    name: str
    result: type[M]
    in_process: InProcess = "call"

    @property
    def function(self) -> Callable[..., dict[str, Any]]:
        """The agent's function for it (``in_process == "call"``)."""
        return agent_ops.FILE_OPS[self.name]

    @property
    def steps(self) -> Callable[..., agent_walk.Steps]:
        """The agent's stepwise walk for it (``in_process == "walk"``)."""
        return agent_ops.STEPWISE[self.name]


STAT = FileOp("stat", FileStat)
READ_TEXT = FileOp("read_text", TextContent)
READ_BYTES = FileOp("read_bytes", ByteContent)
READ_PAGE = FileOp("read_page", TextPage)
LIST_DIR = FileOp("list_dir", DirListing)
WRITE = FileOp("write", WriteResult)
COMMIT = FileOp("commit", CommitResult)
LIST_FILES = FileOp("list_files", FileListing, "walk")
GREP_FILES = FileOp(GREP, GrepListing, "agent")

TABLE: tuple[FileOp[Any], ...] = (STAT, READ_TEXT, READ_BYTES, READ_PAGE, LIST_DIR, WRITE, COMMIT,
                                  LIST_FILES, GREP_FILES)
