"""Which backends branch (issue 48): the host and container backends declare ``Branching`` in
their classes; one without it is refused by name before anything is done, never guessed."""

from __future__ import annotations

import pytest

from toolseam.backends.containers.backend import ContainerBackend
from toolseam.backends.host import HostBackend
from toolseam.seam.capabilities import Branching, branching, supports
from toolseam.seam.errors import ConfigurationError


class _NoBranches:
    name = "elsewhere"


def test_the_host_and_container_backends_declare_branching() -> None:
    for cls in (HostBackend, ContainerBackend):
        for method in ("snapshot_files", "restore_files", "branch_backend", "branch_home",
                       "home_stamps"):
            assert callable(getattr(cls, method)), (cls, method)
    assert supports(HostBackend("."), Branching)


def test_a_backend_without_branching_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match="the elsewhere backend cannot snapshot, "
                       "restore or fork a session's files"):
        branching(_NoBranches())
