"""A workspace a front end makes for a session (0700, this user's) is handed to the uid the
sandbox's root is where that is another user — rootless podman run by root maps the
container's root to the engine user — and left alone otherwise (issue 47: a declared
capability, ``SandboxRootOwner``, where the providers read an engine's endpoint by attribute
name); a container's session id is an option of the backend, never an attribute set on it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from toolseam.backends import create_backend
from toolseam.seam.capabilities import hand_workspace_to_sandbox
from toolseam.seam.errors import ConfigurationError

from ..support.engines import endpoint


@pytest.mark.engines
@pytest.mark.parametrize("engine", ["podman", "podman-rootless", "docker", "podman-remote"])
def test_a_made_workspace_goes_to_the_sandboxs_root(engine: str, tmp_path: Path) -> None:
    made = tmp_path / "ws"
    made.mkdir(mode=0o700)
    rootless = engine == "podman-rootless"
    kind = "podman" if engine.startswith("podman") else "docker"
    options = {"rootless": True} if rootless else {}
    backend = create_backend(kind, workspace=str(made), endpoint=endpoint(engine), **options)
    hand_workspace_to_sandbox(backend, str(made))
    owner = made.stat().st_uid
    if rootless and os.geteuid() == 0:
        socket = endpoint(engine).removeprefix("unix://")
        assert owner == os.stat(socket).st_uid != 0  # the engine user's now, still 0700
        assert made.stat().st_mode & 0o777 == 0o700
    else:  # its root is this user (rootful, or rootless as its own user) or works on a copy
        assert owner == os.geteuid()


@pytest.mark.parametrize("name", ["../x", "", "A", "x" * 65, "-x", "a b", "a/b"])
def test_a_session_id_that_cannot_name_a_container_is_refused(name: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="session_id names a container"):
        create_backend("podman", workspace=str(tmp_path), session_id=name)


def test_a_session_id_names_the_container(tmp_path: Path) -> None:
    backend = create_backend("docker", workspace=str(tmp_path), session_id="sample-1.a_b")
    assert backend.sandbox.session_id == "sample-1.a_b"  # type: ignore[attr-defined]
