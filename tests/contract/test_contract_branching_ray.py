"""The contract suite on a branch through Ray (issue 48: "the contract suite runs on a forked
child and on a restored session of each" backend, Ray's included): a ``RayBackend`` session
(the remote client of the node's own engine, decision 497) on the rootful podman node of the
test cluster, its base dir copied there and home: restored to its start snapshot before every
case, and the child of a real ``fork(1)``. The bindings are test_contract_branching.py's (one branched
session per class, hostile changes and a check of the whole state before each case,
``support/branch_bindings.py``); the cases are the copy-mode ones, as the session's workspace
travels to the node and back as in copy mode (decision 464 lists what is left out)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolseam.ray import RayBackend

from ..support.branch_bindings import ForkedChild, RestoredSession
from ..support.contract_bindings import CopyModeBinding
from ..support.ray_cluster import RAY_TESTS, resource
from .test_contract_branching import COPY_MODE_CASES

pytestmark = RAY_TESTS


class _OnRayNode:
    node = "podman"
    address = ""
    kept_cases = COPY_MODE_CASES

    @pytest.fixture(scope="class", autouse=True)
    @classmethod
    def _cluster(cls, ray_session_cluster: Any) -> None:  # before the class's branch is made
        cls.address = ray_session_cluster.address

    @classmethod
    def made(cls, host_dir: Path) -> Any:
        return RayBackend(str(host_dir), resources=resource(cls.node), address=cls.address)


class TestRayRestoredSession(_OnRayNode, RestoredSession, CopyModeBinding):
    pass


class TestRayForkedChild(_OnRayNode, ForkedChild, CopyModeBinding):
    pass
