"""Images pulled on demand from real registries (Debian's docker-registry on 127.0.0.1 with TLS
from a CA the engines trust through certs.d; one behind htpasswd), on every engine."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolseam import Toolkit
from toolseam.backends.containers.engine.pull import PullProgress, registry_of, split_reference

from ..support.engines import ENGINES, backend, endpoint, required_env

SANDBOX = "localhost/toolseam-sandbox:latest"
NOPYTHON = "localhost/toolseam-nopython:latest"


def registry(variable: str) -> str:
    return required_env(variable, "the test registries")


def push(local: str, remote: str, creds: str | None = None) -> None:
    """Push with the rootful podman CLI (it trusts the registry's CA through certs.d)."""
    argv = ["podman", "push", "-q", *(["--creds", creds] if creds else []), local, remote]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)


def engine_cli(engine: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    argv = ["/usr/bin/docker"] if engine == "docker" else ["podman"]
    if engine == "podman-rootless":
        env["CONTAINER_HOST"] = endpoint(engine)
        argv = ["podman", "--remote"]
    return subprocess.run([*argv, *args], capture_output=True, env=env, text=True, timeout=120)


@pytest.fixture
def fresh_tag(request: pytest.FixtureRequest) -> Iterator[str]:
    """An image name no engine has yet; removed from the engine afterwards."""
    image = f"{registry('TOOLSEAM_REGISTRY')}/toolseam/sandbox:{uuid.uuid4().hex[:10]}"
    yield image
    for engine in ENGINES:
        engine_cli(engine, "rmi", "-f", image)


async def call_bash(engine: str, workspace: Path, image: str, command: str = "echo in-$0",
                    **options: object) -> object:
    tk = Toolkit(backend(engine, str(workspace), image=image, **options))
    try:
        return await tk.call("bash", {"command": command})
    finally:
        await tk.close()


def test_references_split_as_the_engines_read_them() -> None:
    assert split_reference("127.0.0.1:5443/a/b:v1") == ("127.0.0.1:5443/a/b", "v1")
    assert split_reference("127.0.0.1:5443/a/b") == ("127.0.0.1:5443/a/b", "latest")
    assert split_reference("debian@sha256:abc") == ("debian", "sha256:abc")
    assert registry_of("debian:bookworm") == "docker.io"
    assert registry_of("127.0.0.1:5443/a:b") == "127.0.0.1:5443"


@pytest.mark.parametrize("engine", ENGINES)
async def test_missing_image_is_pulled_on_demand_with_progress(
        engine: str, workspace: Path, fresh_tag: str) -> None:
    push(SANDBOX, fresh_tag)
    events: list[PullProgress] = []
    result = await call_bash(engine, workspace, fresh_tag, on_pull_progress=events.append)
    assert result.output == "in-/bin/sh\n", result  # type: ignore[attr-defined]
    assert events and all(e.image == fresh_tag for e in events)
    assert engine_cli(engine, "image", "inspect", fresh_tag).returncode == 0


@pytest.mark.parametrize("engine", ENGINES)
async def test_never_does_not_pull(engine: str, workspace: Path, fresh_tag: str) -> None:
    push(SANDBOX, fresh_tag)
    result = await call_bash(engine, workspace, fresh_tag, pull="never")
    meta = result.metadata  # type: ignore[attr-defined]
    assert meta["failure"] == "could_not_run" and meta["retryable"] is False
    assert fresh_tag in meta["reason"] and "pull policy: never" in meta["reason"]


@pytest.mark.parametrize("engine", ENGINES)
async def test_always_picks_up_a_re_pushed_tag(engine: str, workspace: Path,
                                               fresh_tag: str) -> None:
    """The tag first names the busybox-only image, then the reference one (with python3)."""
    probe = "command -v python3 >/dev/null && echo python || echo none"
    push(NOPYTHON, fresh_tag)
    first = await call_bash(engine, workspace, fresh_tag, pull="always", command=probe)
    assert first.output == "none\n", first  # type: ignore[attr-defined]
    push(SANDBOX, fresh_tag)  # the same tag, now the sandbox image
    kept = await call_bash(engine, workspace, fresh_tag, pull="missing", command=probe)
    assert kept.output == "none\n", kept  # type: ignore[attr-defined]
    fresh = await call_bash(engine, workspace, fresh_tag, pull="always", command=probe)
    assert fresh.output == "python\n", fresh  # type: ignore[attr-defined]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("image", "retryable", "words"), [
    ("127.0.0.1:5999/toolseam/sandbox:latest", True, "connection refused"),  # registry down
    ("{registry}/toolseam/sandbox:no-such-tag", False, "manifest unknown"),
])
async def test_failed_pulls_have_their_kind(engine: str, workspace: Path, image: str,
                                            retryable: bool, words: str) -> None:
    image = image.format(registry=registry("TOOLSEAM_REGISTRY"))
    result = await call_bash(engine, workspace, image)
    meta = result.metadata  # type: ignore[attr-defined]
    assert meta["failure"] == "could_not_run"
    assert meta["retryable"] is retryable, meta["reason"]
    assert image in meta["reason"] and registry_of(image) in meta["reason"]
    assert words in meta["reason"].lower()


@pytest.mark.parametrize("engine", ENGINES)
async def test_credentials_explicit_and_wrong(engine: str, workspace: Path) -> None:
    image = f"{registry('TOOLSEAM_AUTH_REGISTRY')}/toolseam/sandbox:latest"
    user, password = os.environ["TOOLSEAM_AUTH_USER"], os.environ["TOOLSEAM_AUTH_PASSWORD"]
    engine_cli(engine, "rmi", "-f", image)
    try:
        wrong = await call_bash(engine, workspace, image,
                                auth={"username": user, "password": "wrong"})
        meta = wrong.metadata  # type: ignore[attr-defined]
        assert meta["failure"] == "could_not_run" and meta["retryable"] is False
        assert "unauthorized" in meta["reason"] and image in meta["reason"]
        right = await call_bash(engine, workspace, image,
                                auth={"username": user, "password": password})
        assert right.output == "in-/bin/sh\n", right  # type: ignore[attr-defined]
    finally:
        engine_cli(engine, "rmi", "-f", image)


@pytest.mark.engines  # needs an engine without naming it in a parameter
def test_pull_policy_from_the_cli_and_settings(workspace: Path, fresh_tag: str) -> None:
    import sys

    from toolseam import ConfigurationError, Settings
    from toolseam.policy.settings import parse_settings

    push(SANDBOX, fresh_tag)
    env = {**os.environ, "TOOLSEAM_DOCKER_URL": endpoint("docker")}
    never = subprocess.run(
        [sys.executable, "-m", "toolseam.frontends.cli", "call", "bash", '{"command": "true"}', "--backend",
         "docker", "--image", fresh_tag, "--workspace", str(workspace), "--pull", "never"],
        capture_output=True, text=True, timeout=120, env=env)
    assert never.returncode == 3 and "pull policy: never" in never.stdout
    with pytest.raises(ConfigurationError, match="pull: Input should be 'never', 'missing' or"):
        parse_settings({"pull": "sometimes"})
    tk = Toolkit("docker", settings=Settings(pull="never"),
                 backend_options={"workspace": str(workspace), "image": fresh_tag,
                                  "endpoint": endpoint("docker")})
    assert tk.backend.sandbox.pull_policy == "never"  # type: ignore[attr-defined]


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_default_image_is_a_public_one_pulled_on_demand(engine: str,
                                                                  workspace: Path) -> None:
    """No image named: Debian's public slim image. Where Docker Hub is reachable it is pulled
    and serves the session; where it is not (these machines), the first call is could-not-run,
    retryable, naming the image and the registry."""
    from toolseam.backends.containers.backend import DEFAULT_IMAGE

    assert DEFAULT_IMAGE == "docker.io/library/debian:bookworm-slim"
    tk = Toolkit(backend(engine, str(workspace), image=DEFAULT_IMAGE))
    try:
        result = await tk.call("bash", {"command": "echo ran"})
    finally:
        await tk.close()
    if result.metadata.get("failure") == "could_not_run":
        assert result.metadata["retryable"] is True, result
        assert "'docker.io/library/debian:bookworm-slim' from docker.io" in result.output
    else:
        assert result.output == "ran\n"
