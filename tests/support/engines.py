"""Which container engines the tests use, from .engines.env (written by scripts/setup-engines.sh).

Locally a missing engine is a visible skip (-ra); with TOOLSEAM_REQUIRE_ENGINES=1 (CI, set by
the test script) it is a failure, so CI can never pass by skipping the engines.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from toolseam import Toolkit, ToolResult
from toolseam.backends.containers.engine.attach import TlsFiles
from toolseam.backends.docker import DockerBackend
from toolseam.backends.podman import PodmanBackend
from toolseam.seam.protocol import BuiltinExec

IMAGE = os.environ.get("TOOLSEAM_IMAGE", "localhost/toolseam-sandbox:latest")
# THE backend list of the suite: every other list is made from these.
ENGINES = ("podman", "podman-rootless", "docker")
"""The engines on this machine (unix sockets: bind mode)."""
REMOTE_ENGINES = ("podman-remote", "docker-remote")
"""Engines in their own mount namespaces, reached over TCP (docker with TLS): copy mode."""
ALL_ENGINES = (*ENGINES, *REMOTE_ENGINES)
LOCAL_BACKENDS = ("host", *ENGINES)
"""Every backend on this machine: the host and the local engines."""
EVERY_BACKEND = ("host", *ALL_ENGINES)
_URLS = {"podman": "TOOLSEAM_PODMAN_URL", "podman-rootless": "TOOLSEAM_PODMAN_ROOTLESS_URL",
         "docker": "TOOLSEAM_DOCKER_URL", "podman-remote": "TOOLSEAM_REMOTE_PODMAN_URL",
         "docker-remote": "TOOLSEAM_REMOTE_DOCKER_URL"}


def required_env(variable: str, what: str) -> str:
    """A variable the test script sets; unset, a visible skip — or a failure in CI."""
    value = os.environ.get(variable)
    if value:
        return value
    message = f"{what}: {variable} is not set (run scripts/setup-engines.sh)"
    if os.environ.get("TOOLSEAM_REQUIRE_ENGINES"):
        pytest.fail(message)
    pytest.skip(message)


def endpoint(engine: str) -> str:
    return required_env(_URLS[engine], engine)


def remote_image() -> str:
    """The image remote engines pull from the local registry (they share no image store)."""
    return required_env("TOOLSEAM_REMOTE_IMAGE", "remote engines")


def backend(engine: str, workspace: str, **options: object) -> BuiltinExec:
    url = str(options.pop("endpoint", None) or endpoint(engine))
    if engine == "docker-remote":
        tls = TlsFiles.from_dir(required_env("TOOLSEAM_REMOTE_DOCKER_CERT_PATH", engine))
        return DockerBackend(workspace, image=str(options.pop("image", remote_image())),  # type: ignore[arg-type]
                             endpoint=url, tls=tls, **options)
    if engine == "podman-remote":
        return PodmanBackend(workspace, image=str(options.pop("image", remote_image())),  # type: ignore[arg-type]
                             endpoint=url, **options)
    if engine == "docker":
        return DockerBackend(workspace, image=str(options.pop("image", IMAGE)), endpoint=url, **options)  # type: ignore[arg-type]
    return PodmanBackend(workspace, image=str(options.pop("image", IMAGE)), endpoint=url,  # type: ignore[arg-type]
                         rootless=engine == "podman-rootless", **options)


def shared_dir() -> Path:
    """A directory a rootless engine's user can reach (pytest's tmp dirs are 0700 root)."""
    root = Path(tempfile.gettempdir()) / "toolseam-tests"
    root.mkdir(exist_ok=True)
    root.chmod(0o1777)
    path = root / uuid.uuid4().hex[:10]
    path.mkdir()
    path.chmod(0o777)
    return path


def remove_shared(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


async def serve_every_builtin(tk: Toolkit, label: str) -> dict[str, ToolResult]:
    """Each of the seven builtins once, through ``tk``, on a small tree it makes; asserts what
    the reference image answers, byte for byte, and returns the results."""
    results = {name: await tk.call(name, args) for name, args in (
        ("write", {"path": "d/f.txt", "content": "one\ntwo\n"}),
        ("read", {"path": "d/f.txt"}),
        ("edit", {"path": "d/f.txt", "oldString": "two", "newString": "TWO"}),
        ("apply_patch", {"patchText": "*** Begin Patch\n*** Add File: p.txt\n+patched\n"
                                      "*** End Patch"}),
        ("grep", {"pattern": "TWO"}),
        ("glob", {"pattern": "**/*.txt"}),
        ("bash", {"command": "cat d/f.txt p.txt"}))}
    for name, result in results.items():
        assert not result.is_error, (label, name, result.output)
    assert results["read"].output.startswith("00001| one\n")
    assert results["grep"].output == "d/f.txt:2:TWO"
    assert results["glob"].output == "d/f.txt\np.txt"
    assert results["bash"].output == "one\nTWO\npatched\n"
    return results
