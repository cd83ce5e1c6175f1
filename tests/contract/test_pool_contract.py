"""A pooled session is indistinguishable from a fresh one: the container contract suite, run on
sandboxes a ``SandboxPool`` started before the workspace existed and handed out afterwards.

Every engine hands out in bind mode here (the base dir mounted onto the running container's
slot; rootless podman's inside its own mount namespace), so the whole suite runs, host-dir
cases included; a pool made to copy skips the same cases as copy mode everywhere
(``HOST_FILESYSTEM_CASES``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from toolseam import SandboxPool
from toolseam.backends.containers.backend import ContainerBackend
from toolseam.testing.contract import Sandbox

from ..support.contract_bindings import ContainerBinding, CopyModeBinding, pool_factory
from ..support.shared_cases import SharedParameterSandbox


class _Pooled(SharedParameterSandbox):
    """Mixed in before a container binding, whose ``host_root`` and ``engine`` it uses; the
    rows of a read-only table share a sandbox (``support/shared_cases.py``)."""

    engine = ""
    pool_options: dict[str, Any] = {}
    pool: SandboxPool

    @pytest_asyncio.fixture(scope="class", loop_scope="class")
    @classmethod
    async def _class_pool(cls) -> AsyncIterator[SandboxPool]:
        """One pool of one sandbox per class, refilled as a user's is: it starts the next
        case's sandbox while a case runs (a pool per case cost each case a cold start)."""
        async with SandboxPool(pool_factory(cls.engine), size=1, **cls.pool_options) as pool:
            yield pool

    @pytest.fixture(autouse=True)
    def _pooled_from(self, _class_pool: SandboxPool) -> None:
        self.pool = _class_pool

    @contextlib.asynccontextmanager
    async def opened(self, tmp_path: Path) -> AsyncIterator[Sandbox]:
        host_dir = self.host_root(tmp_path) / "ws"
        host_dir.mkdir(parents=True)
        host_dir.chmod(0o777)  # a rootless sandbox maps to another uid
        # one sandbox per case, as the unpooled suite: started before the workspace exists
        await self.pool.wait_full()
        pooled: ContainerBackend = await self.pool.backend(host_dir)
        try:
            yield Sandbox(pooled, "/workspace", host_dir)
        finally:
            await pooled.close()


class TestPooledPodman(_Pooled, ContainerBinding):
    engine = "podman"


class TestPooledDocker(_Pooled, ContainerBinding):
    engine = "docker"


class TestPooledPodmanRootless(_Pooled, ContainerBinding):
    engine = "podman-rootless"


class TestPooledPodmanRootlessCopy(_Pooled, CopyModeBinding):
    """Where the pool cannot mount (a process that is not root), rootless podman copies."""

    engine = "podman-rootless"
    pool_options = {"workspace_mode": "copy"}
