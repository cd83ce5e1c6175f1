"""Every SDK exception maps, once, to a could-not-run with the right retryability.

Like httpx's tests/test_exceptions.py: walk each SDK's error module so a class added upstream
cannot slip through the mapping as an unhandled exception.
"""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import warnings
from typing import Any

import docker.errors
import podman.errors
import pytest
import requests

from toolseam import CouldNotRunError
from toolseam.backends.containers.engine.docker_dialect import DockerDialect
from toolseam.backends.containers.engine.errors import (
    EngineConflict,
    EngineError,
    EngineNotFound,
    EnginePermanent,
    EngineUnreachable,
    SdkErrors,
    map_engine_error,
)
from toolseam.backends.containers.engine.podman_dialect import PodmanDialect
from toolseam.backends.containers.engine.retry import is_transient
from toolseam.backends.docker import DockerEngine
from toolseam.backends.podman import PodmanEngine

from ..support.engines import ENGINES, IMAGE, endpoint

DOCKER, PODMAN = DockerDialect.errors, PodmanDialect.errors


def _instance(cls: type[Exception]) -> Exception:
    """Construct an SDK exception whatever its signature wants."""
    with warnings.catch_warnings():  # podman-py's legacy classes warn when constructed
        warnings.simplefilter("ignore")
        return _construct(cls)


def _construct(cls: type[Exception]) -> Exception:
    for args in ((), ("message",), ("message", None), ("message", None, None),
                 ("message", None, "explanation")):
        try:
            return cls(*args)
        except TypeError:
            continue
    instance = cls.__new__(cls)
    Exception.__init__(instance, "message")
    return instance


def _classes(module: Any) -> list[type[Exception]]:
    return [c for _, c in inspect.getmembers(module, inspect.isclass)
            if issubclass(c, Exception) and c.__module__.startswith(module.__name__.split(".")[0])]


@pytest.mark.parametrize(("sdk", "module", "errors"), [
    ("docker", docker.errors, DOCKER), ("podman", podman.errors, PODMAN)])
def test_every_sdk_exception_is_mapped(sdk: str, module: Any, errors: SdkErrors) -> None:
    classes = _classes(module)
    assert len(classes) > 10
    for cls in classes:
        mapped = map_engine_error(sdk, "unix:///e.sock", _instance(cls), errors)
        assert isinstance(mapped, EngineError) and isinstance(mapped, CouldNotRunError), cls
        assert sdk in mapped.reason and "unix:///e.sock" in mapped.reason, cls
        if issubclass(cls, errors.not_found):
            assert isinstance(mapped, EngineNotFound) and mapped.retryable is False, cls


def test_transport_failures_are_unreachable_and_retryable() -> None:
    for exc in (requests.exceptions.ConnectionError("refused"), FileNotFoundError(2, "missing"),
                ConnectionRefusedError(111, "refused")):
        mapped = map_engine_error("docker", "unix:///e.sock", exc, DOCKER)
        assert isinstance(mapped, EngineUnreachable)
        assert mapped.reason.startswith("docker engine unreachable at unix:///e.sock")
        assert mapped.retryable is True
    # docker's client constructor wraps a refused socket in a bare DockerException: what was
    # being done says it, not the words of the message
    bare = docker.errors.DockerException("Error while fetching server API version")
    assert isinstance(map_engine_error("docker", "unix:///e.sock", bare, DOCKER, connecting=True),
                      EngineUnreachable)


def _http_error(status: int, text: str) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(text, response=response)


@pytest.mark.parametrize(("status", "kind", "retryable"), [
    (404, EngineNotFound, False), (409, EngineConflict, False), (400, EnginePermanent, False),
    (403, EnginePermanent, False), (500, EngineError, True), (503, EngineError, True)])
def test_the_status_decides_the_kind_never_the_message(status: int, kind: type[EngineError],
                                                       retryable: bool) -> None:
    for text in ("no such container: not found", "bind source path does not exist", "conflict"):
        mapped = map_engine_error("podman", "tcp://e:1", _http_error(status, text), PODMAN)
        assert type(mapped) is kind and mapped.retryable is retryable, (status, text)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_engine_answers_each_kind_typed(engine: str) -> None:
    """On the real engines: a missing container or volume is ``EngineNotFound`` (and removing
    one is no failure); a name in use is ``EngineConflict`` where the engine says 409."""
    from toolseam.backends.containers.engine.protocol import ContainerSpec, Hardening

    url = endpoint(engine)
    made = DockerEngine(url) if engine == "docker" else PodmanEngine(url)
    try:
        with pytest.raises(EngineNotFound):
            made.state("toolseam-test-no-such-container")
        assert made.volume_exists("toolseam-test-no-such-volume") is False
        assert made.image_exists("localhost/toolseam-no-such-image:none") is False
        made.remove("toolseam-test-no-such-container")
        made.remove_volume("toolseam-test-no-such-volume")
        spec = ContainerSpec(image=IMAGE, name=f"toolseam-test-conflict-{os.getpid()}",
                             command=["true"], labels={}, environment={}, binds=[],
                             hardening=Hardening())
        first = made.create(spec)
        try:
            with pytest.raises(EngineError) as caught:
                made.create(spec)
            assert spec.name in caught.value.reason
            if engine == "docker":  # libpod answers a name in use with a 500, not a 409
                assert isinstance(caught.value, EngineConflict) and not caught.value.retryable
        finally:
            made.remove(first)
    finally:
        made.close()


def test_only_transient_engine_errors_are_retried() -> None:
    class Response:
        def __init__(self, code: int) -> None:
            self.status_code = code

    assert is_transient(requests.exceptions.ReadTimeout())
    assert is_transient(docker.errors.APIError("x", response=Response(503)))  # type: ignore[arg-type]
    assert not is_transient(docker.errors.APIError("x", response=Response(404)))  # type: ignore[arg-type]
    assert not is_transient(requests.exceptions.ConnectionError("refused"))  # fail fast, name it
    assert not is_transient(docker.errors.ImageNotFound("nope"))


@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_the_backend_module_without_its_sdk_names_what_to_install(engine: str) -> None:
    """``import toolseam.backends.podman`` without the extra: the install line, not a bare
    ModuleNotFoundError (H7's request)."""
    probe = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] == {engine!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from toolseam.seam.errors import BackendUnavailable\n"
        "try:\n"
        f"    import toolseam.backends.{engine}\n"
        "except BackendUnavailable as exc:\n"
        "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith(f"the {engine} backend needs the '{engine}' package: pip install "), out
