"""pydantic-ai's own workspace conformance suite (``WorkspaceBackendSuite``, every optional
fixture: fresh, destructive, attach, destroy) over ``ToolseamWorkspace`` on every backend.

One environment per class (the suite's ``backend`` fixture made class-scoped): the backend is
loop-independent (its toolkit lives on a loop of its own), so each rule's loop can use it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.workspaces import WorkspaceBackend, WorkspaceRef
from pydantic_ai.workspaces.conformance import WorkspaceBackendSuite

from toolseam.integrations.pydantic_ai import ToolseamWorkspace

from ..support.engines import remove_shared
from ..support.providers import provider_options


class _ToolseamSuite(WorkspaceBackendSuite):
    engine = "host"

    @pytest.fixture(scope="class")
    @classmethod
    def secret_store(cls, tmp_path_factory: pytest.TempPathFactory) -> Path:
        return tmp_path_factory.mktemp("workspace-secrets")

    @pytest.fixture(scope="class")
    @classmethod
    def made(cls, secret_store: Path) -> Iterator[Callable[[], ToolseamWorkspace]]:
        """Builds backends for this class's engine; destroys every one that opened."""
        built: list[ToolseamWorkspace] = []
        dirs: list[Path] = []

        def build() -> ToolseamWorkspace:
            name, options, workspace = provider_options(cls.engine)
            if workspace is not None:
                dirs.append(workspace)
            made = ToolseamWorkspace(name, secret_store=secret_store, **options)
            built.append(made)
            return made

        yield build
        for backend in built:
            if backend.ref is not None:
                asyncio.run(backend.destroy())
        for path in dirs:
            remove_shared(path)

    @pytest.fixture(scope="class")
    @classmethod
    def backend(cls, made: Callable[[], ToolseamWorkspace]) -> WorkspaceBackend:  # type: ignore[override]
        return made()

    @pytest.fixture
    def fresh_backend(self, made: Callable[[], ToolseamWorkspace]  # type: ignore[override]
                      ) -> Callable[[], WorkspaceBackend]:
        return made

    @pytest.fixture
    def attach_backend(self, secret_store: Path  # type: ignore[override]
                       ) -> Callable[[WorkspaceRef], WorkspaceBackend]:
        return lambda ref: ToolseamWorkspace.attach(ref, secret_store=secret_store)

    @pytest.fixture
    def destroy_environment(self) -> Callable[[Any], Any]:  # type: ignore[override]
        return lambda backend: backend.destroy()


class TestHost(_ToolseamSuite):
    engine = "host"


class TestPodman(_ToolseamSuite):
    engine = "podman"


class TestPodmanRootless(_ToolseamSuite):
    engine = "podman-rootless"


class TestDocker(_ToolseamSuite):
    engine = "docker"
