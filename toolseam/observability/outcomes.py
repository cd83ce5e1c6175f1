"""How a tool call ended, in the words spans, metrics and the report share."""

from __future__ import annotations

from typing import Literal

from ..builtins import ToolResult

Outcome = Literal["ok", "error", "could_not_run", "raised"]


def outcome_of(result: ToolResult) -> Outcome:
    if not result.is_error:
        return "ok"
    return "could_not_run" if result.metadata.get("failure") == "could_not_run" else "error"


def error_type(result: ToolResult) -> str | None:
    """The OpenTelemetry ``error.type`` of a result: a could-not-run's cause (``sandbox_lost``
    …), a timed-out command, a refusal, or a tool error; None when it succeeded."""
    if not result.is_error:
        return None
    meta = result.metadata
    if meta.get("failure") == "could_not_run":
        return str(meta.get("cause") or "could_not_run")
    if meta.get("timedOut"):
        return "timeout"
    if meta.get("refused"):
        return "refused"
    if "exitCode" in meta:
        return "exit_code"  # the command ran and failed: the CLI span has the code
    return "tool_error"
