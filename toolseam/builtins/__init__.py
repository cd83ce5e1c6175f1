"""The seven builtins, above the seam: they import only ``seam``, ``listing``, ``policy`` and
``model_text`` (how a result reads to a model) — the import contract (.importlinter) holds it."""

from ._base import Builtin, CallContext, OutputEvent, SessionView, ToolResult, could_not_run_result
from ._spill import remove_spills
from .apply_patch import ApplyPatch
from .bash import Bash
from .files import Edit, Read, Write
from .search import Glob, Grep

BUILTIN_NAMES = ("bash", "read", "write", "edit", "apply_patch", "grep", "glob")


def all_builtins() -> dict[str, Builtin]:  # type: ignore[type-arg]
    tools: list[Builtin] = [Bash(), Read(), Write(), Edit(), ApplyPatch(), Grep(), Glob()]  # type: ignore[type-arg]
    return {tool.name: tool for tool in tools}


__all__ = ["BUILTIN_NAMES", "Builtin", "CallContext", "OutputEvent", "SessionView", "ToolResult",
           "all_builtins", "could_not_run_result", "remove_spills"]
