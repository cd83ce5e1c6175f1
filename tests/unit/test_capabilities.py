"""Capabilities are declared, never guessed (issue 47): each backend names what it has
(``capabilities``), every declared capability's methods are there, and a backend that has a
method of the right name without declaring the capability is refused it."""

from __future__ import annotations

import asyncio
import inspect
import typing
from typing import Any, ClassVar

import pytest

from toolseam.backends import KINDS, backend_class
from toolseam.backends.composed import ComposedBackend
from toolseam.egress.session import SessionEgress
from toolseam.seam import capabilities
from toolseam.seam.capabilities import (
    Branching,
    DurableSessions,
    Egress,
    EngineShell,
    ExposedPorts,
    InteractiveProcesses,
    ResourceUsage,
    SandboxKill,
    SandboxRootOwner,
    declared_capabilities,
    supports,
)
from toolseam.seam.errors import ConfigurationError
from toolseam.seam.protocol import WorkspaceTransfer
from toolseam.testing.fake import FakeBackend
from toolseam.testing.hostile import HostileBackend

CAPABILITIES = (Branching, DurableSessions, Egress, EngineShell, ExposedPorts,
                InteractiveProcesses, ResourceUsage, SandboxKill, SandboxRootOwner,
                WorkspaceTransfer)
CLASSES = [*(backend_class(name) for name in KINDS), ComposedBackend, FakeBackend]


def members(capability: type) -> set[str]:
    return set(typing._get_protocol_attrs(capability))  # type: ignore[attr-defined]


def test_every_capability_is_a_protocol_of_the_seam() -> None:
    declared = {c for c in vars(capabilities).values()
                if isinstance(c, type) and getattr(c, "_is_runtime_protocol", False)
                and c.__module__ == capabilities.__name__}
    assert declared | {WorkspaceTransfer} == set(CAPABILITIES)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__name__)
def test_a_declared_capability_has_its_methods(cls: type) -> None:
    declared = declared_capabilities(cls)
    assert declared <= set(CAPABILITIES), f"{cls.__name__} declares what is no capability"
    missing = {c.__name__: sorted(m for m in members(c) if not hasattr(cls, m))
               for c in declared}
    assert not any(missing.values()), f"{cls.__name__} declares without the methods: {missing}"
    for capability in declared:
        for name in members(capability):
            wanted = inspect.iscoroutinefunction(getattr(capability, name, None))
            if wanted:
                assert inspect.iscoroutinefunction(getattr(cls, name)), (cls, name)


def test_what_each_backend_declares() -> None:
    table = {name: {c.__name__ for c in declared_capabilities(backend_class(name))}
             for name in KINDS}
    agent = {"Egress", "ExposedPorts", "InteractiveProcesses"}
    assert table == {
        "host": agent | {"DurableSessions", "Branching", "SandboxKill", "ResourceUsage",
                         "WorkspaceTransfer"},
        "podman": agent | {"DurableSessions", "Branching", "EngineShell", "SandboxKill",
                         "ResourceUsage", "SandboxRootOwner", "WorkspaceTransfer"},
        "docker": agent | {"DurableSessions", "Branching", "EngineShell", "SandboxKill",
                         "ResourceUsage", "SandboxRootOwner", "WorkspaceTransfer"},
        # the remote client of the node's own engine: what every local kind forwards
        # (decision 493; exposed ports and the engine's shell are not forwarded)
        "ray": {"Egress", "InteractiveProcesses", "DurableSessions", "Branching",
                "SandboxKill", "ResourceUsage", "WorkspaceTransfer"},
        # the class a name finds declares the kind's one class-level fact (its sessions can
        # outlive their client: from_handle); an instance is of the class made for its hosted
        # kind's capabilities (remote/client.py: remote_class)
        "remote": {"DurableSessions"},
    }


class LooksCapable(FakeBackend):
    """Every method of every capability, and no declaration: the old rule (a method of the
    right name) took it for a backend with all of them."""

    async def open_egress(self, serve: Any, ca_pem: str | None,
                          ports_for: Any = None) -> dict[str, object]:
        raise AssertionError("an undeclared capability was used")

    async def expose_port(self, port: int, host: str, host_port: int) -> Any:
        raise AssertionError("an undeclared capability was used")

    def shell_access(self, user: str | None = None) -> Any:
        raise AssertionError("an undeclared capability was used")


for _capability in CAPABILITIES:  # the rest, as stubs of the right name
    for _name in members(_capability):
        if not hasattr(LooksCapable, _name):
            setattr(LooksCapable, _name, lambda self, *args: None)


def test_an_undeclared_capability_is_refused_whatever_the_methods() -> None:
    backend = LooksCapable()
    assert all(isinstance(backend, c) for c in CAPABILITIES)  # what a guess would have said
    assert not any(supports(backend, c) for c in CAPABILITIES)
    with pytest.raises(ConfigurationError, match="expose: the fake backend cannot carry"):
        capabilities.exposed_ports(backend)
    with pytest.raises(ConfigurationError, match="orphan_timeout_s: the fake backend cannot"):
        capabilities.durable_sessions(backend)
    with pytest.raises(ConfigurationError, match="snapshot: the fake backend cannot"):
        capabilities.branching(backend)
    with pytest.raises(ConfigurationError,
                       match="network 'egress': the fake backend has no agent channel"):
        asyncio.run(SessionEgress.start({}, backend))


class DeclaresExposedPorts(LooksCapable):
    capabilities: ClassVar[frozenset[type]] = frozenset({ExposedPorts})


def test_a_declared_capability_is_granted_and_only_it() -> None:
    backend = DeclaresExposedPorts()
    assert capabilities.exposed_ports(backend) is backend
    assert [c for c in CAPABILITIES if supports(backend, c)] == [ExposedPorts]


def test_a_wrapper_declares_what_it_wraps() -> None:
    assert declared_capabilities(HostileBackend(DeclaresExposedPorts(), "reversed")) == {
        ExposedPorts}
    assert declared_capabilities(HostileBackend(FakeBackend(), "reversed")) == frozenset()
