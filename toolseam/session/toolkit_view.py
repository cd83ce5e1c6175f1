"""``ToolkitView``: the toolkit as its parts see it — what ``raw``, ``interactive``,
``interactive_tools``, ``ports``, ``branching``, ``durable`` and ``lifetime`` read of the
``Toolkit`` that holds them.

The toolkit is made of these parts, so they cannot import it (each would be a circle, issue 47);
they declare here, below all of them, the little of it they use, and ``Toolkit`` is one.
"""

from __future__ import annotations

from typing import Protocol

from ..policy.session import Session
from ..policy.settings import Settings
from ..seam.models import SandboxInfo
from ..seam.protocol import BuiltinExec


class ToolkitView(Protocol):
    """One session, to the parts of ``Toolkit`` that serve it."""

    # what an attach found running outside the jobs table (``durable.Durable.opened`` sets it)
    adopted_jobs: list[int]

    @property
    def session_id(self) -> str: ...

    @property
    def backend(self) -> BuiltinExec: ...

    @property
    def base_dir(self) -> str: ...  # absolute once open; "" before

    @property
    def confine(self) -> bool: ...  # the file tools' paths stay inside base_dir

    @property
    def settings(self) -> Settings: ...

    @property
    def services(self) -> Session: ...  # jobs, shells, environment, read scope

    @property
    def info(self) -> SandboxInfo | None: ...  # None until open

    @property
    def enabled_builtins(self) -> list[str]: ...

    async def open(self) -> SandboxInfo: ...  # idempotent: each part opens before it acts
