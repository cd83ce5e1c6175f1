"""``SessionReport``: what one session used, returned by ``Toolkit.close`` (and
``SyncToolkit.close``) and logged — what a workflow engine bills a step from.

Each figure is measured or None, never a guess; docs/observability.md says where each comes
from on each backend.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class EgressTotals(BaseModel):
    """One host's egress in a session."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    connections: int = Field(0, description="Connection attempts (allowed or refused).")
    bytes: int = Field(0, description="Bytes both ways through allowed connections.")
    refused: int = Field(0, description="Attempts the rules refused.")


class SessionReport(BaseModel):
    """What one session used, from open to close."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    session_id: str
    backend: str
    wall_seconds: float = Field(description="From the first open to the end of close.")
    calls: dict[str, int] = Field(description=(
        "Tool calls by outcome: ok, error (the tool failed in a way the model reads), "
        "could_not_run (the sandbox could not run it), raised (the host was told by an "
        "exception)."))
    cpu_seconds: float | None = Field(description=(
        "CPU time of the whole sandbox (its cgroup, or the host agent's process tree); where "
        "neither is measurable, of the session's commands (the agent's wait4); None if no "
        "figure was measured."))
    memory_peak_bytes: int | None = Field(description=(
        "The sandbox's peak memory (its cgroup) where the engine keeps it; else the largest "
        "peak resident set of one command of the session; None if no figure was measured."))
    bytes_written: int = Field(description=(
        "Bytes of file content the session's tools (write, edit, apply_patch) wrote."))
    egress: dict[str, EgressTotals] = Field(description="Egress by host (egress mode only).")

    def summary(self) -> str:
        """One line for a log."""
        calls = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.calls.items())) or "none"
        cpu = "unmeasured" if self.cpu_seconds is None else f"{self.cpu_seconds:.3f} s"
        peak = ("unmeasured" if self.memory_peak_bytes is None
                else f"{self.memory_peak_bytes / (1 << 20):.1f} MiB")
        hosts = ", ".join(f"{h} ({t.connections} conn, {t.bytes} B, {t.refused} refused)"
                          for h, t in sorted(self.egress.items()))
        return (f"session {self.session_id} on {self.backend}: {self.wall_seconds:.2f} s, calls: "
                f"{calls}; cpu {cpu}; memory peak {peak}; {self.bytes_written} B written"
                + (f"; egress: {hosts}" if hosts else ""))
