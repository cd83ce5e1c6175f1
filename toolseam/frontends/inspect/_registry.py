"""The ``inspect_ai`` entry point: importing the provider registers ``@sandboxenv("toolseam")``."""

from __future__ import annotations

from ._provider import ToolseamSandboxEnvironment

__all__ = ["ToolseamSandboxEnvironment"]
