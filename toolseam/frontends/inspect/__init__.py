"""toolseam as an inspect_ai sandbox: ``sandbox="toolseam"`` (or ``("toolseam", config)``).

Installed with ``pip install 'toolseam[inspect]'``; inspect finds it through the ``inspect_ai``
entry point (``toolseam.frontends.inspect._registry``). docs/integrations/inspect.md.
"""

from __future__ import annotations

from ._config import ToolseamSandboxConfig
from ._provider import ToolseamSandboxEnvironment

__all__ = ["ToolseamSandboxConfig", "ToolseamSandboxEnvironment"]
