"""The contract suite's binding to ``RayBackend`` on a node of the session's Ray cluster
(tests/contract/test_contract_ray.py, test_contract_durable.py).

From the caller's side a Ray session is copy mode — the workspace goes to the node as a tar
and comes back at sync/close — so the cases that arrange files in the host dir *during* the
session are listed as for a remote engine (``CopyModeBinding``). Processes are looked for on
this machine: every node of the test cluster runs here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from toolseam.ray import RayBackend
from toolseam.seam.protocol import BuiltinExec
from toolseam.testing.contract import RawContract, Sandbox
from toolseam.testing.read_grids import read_page_mismatch, read_window_mismatch

from .contract_bindings import CopyModeBinding
from .ray_cluster import RayTestCluster, resource


class RayBinding(CopyModeBinding):
    node = ""  # a node of the test cluster (ray_cluster.NODES)
    address = ""

    @pytest.fixture(autouse=True)
    def _cluster(self, ray_cluster: RayTestCluster) -> None:
        self.address = ray_cluster.address

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        return RayBackend(str(host_dir), resources=resource(self.node),
                          address=self.address), "/workspace"

    @staticmethod
    def capability_probe() -> Any:
        """A backend of this binding's class, for the capabilities it claims (unopened)."""
        return RayBackend()


# The two grids of the file part (84 reads, one sandbox) test the node's agent reading a
# file, the same code on every engine: one node runs each grid whole, the others one point of it.
async def _one_read_window(self: Any, sandbox: Sandbox) -> None:
    await sandbox.put({"f.txt": b"a\r\nb\r\n"})
    assert await read_window_mismatch(sandbox.backend, sandbox.ref("f.txt"), "a\r\nb\r\n",
                                      (2, 5)) is None


async def _one_read_page(self: Any, sandbox: Sandbox) -> None:
    await sandbox.put({"f.txt": b"x\n\n\ny"})
    assert await read_page_mismatch(sandbox.backend, sandbox.ref("f.txt"), "x\n\n\ny", 2, 5) is None


class RaySubsetBinding(RayBinding):
    """Every case of the suite, the file part's two grids by one point each."""

    # the same case with fewer arguments: one point of its grid instead of the grid
    test_read_window_is_a_slice_of_split_lines = _one_read_window  # type: ignore[assignment]
    test_read_page_is_a_slice_of_lines = _one_read_page  # type: ignore[assignment]


class RayRawBinding(RawContract):
    """The raw API's contract on a node of the test cluster (``node``), with the direct
    connection asserted: the raw calls must not fall back to Ray."""

    node = ""
    address = ""

    @pytest.fixture(autouse=True)
    def _cluster(self, ray_cluster: RayTestCluster) -> None:
        self.address = ray_cluster.address

    async def make_backend(self, host_dir: Path) -> tuple[BuiltinExec, str]:
        return DirectOnly(str(host_dir), resources=resource(self.node),
                          address=self.address), "/workspace"


class DirectOnly(RayBackend):
    """A ``RayBackend`` whose every tool call must go on the direct connection: a call that
    finds it gone (the node refused a request and dropped it) fails the test."""

    async def _send(self, name: str, kwargs: dict[str, Any], on_event: Any = None) -> Any:
        answer = await super()._send(name, kwargs, on_event)
        if self._info is not None and name != "close":
            assert self.direct_connected, f"{name}: the direct connection is gone"
        return answer
