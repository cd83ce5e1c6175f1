"""``ToolkitOptions``: the keyword options of a session, written once — ``Toolkit``'s keywords,
which ``SyncToolkit`` (and anything else that makes a toolkit for its caller) takes as they are
(``**options: Unpack[ToolkitOptions]``), so a new option is one line here and one in
``Toolkit.__init__`` (``tests/unit/test_toolkit_options.py`` keeps the two alike).

What each option does is in ``Toolkit``'s docstring.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from ..backends.snapshots import Snapshot
    from ..builtins import OutputEvent
    from ..policy.readscope import Approver
    from ..policy.settings import Settings
    from .lifetime import Lifetime
    from .toolkit import HostTool


class ToolkitOptions(TypedDict, total=False):
    """``Toolkit``'s keyword options (all optional; ``Toolkit`` has the defaults)."""

    base_dir: str | os.PathLike[str] | None
    confine_to_base_dir: bool
    settings: Settings | Mapping[str, Any] | None
    tools: Mapping[str, bool] | None
    host_tools: Sequence[HostTool]
    raise_could_not_run: bool
    env: Mapping[str, str] | None
    env_extra: Mapping[str, str] | None
    on_output: Callable[[OutputEvent], None] | None
    session_id: str | None
    approver: Approver | None
    shell_id_persisted: bool
    lifetime: Lifetime | None
    backend_options: Mapping[str, Any] | None
    interactive_tools: bool
    snapshot: Snapshot | str | None
