"""Every SDK exception maps, once, to a could-not-run with the right retryability.

Like httpx's tests/test_exceptions.py: walk each SDK's error module so a class added upstream
cannot slip through the mapping as an unhandled exception.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import warnings
from typing import Any

import docker.errors
import podman.errors
import pytest
import requests

from toolseam import CouldNotRunError
from toolseam.backends import docker as docker_backend
from toolseam.backends import podman as podman_backend
from toolseam.backends._container_sandbox import map_engine_error
from toolseam.backends._retry import is_transient


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


@pytest.mark.parametrize(("sdk", "module", "not_found", "api_error"), [
    ("docker", docker.errors, docker_backend._NOT_FOUND, docker.errors.APIError),
    ("podman", podman.errors, podman_backend._NOT_FOUND, podman.errors.APIError),
])
def test_every_sdk_exception_is_mapped(sdk: str, module: Any, not_found: tuple[type[Exception], ...],
                                       api_error: type[Exception]) -> None:
    classes = _classes(module)
    assert len(classes) > 10
    for cls in classes:
        mapped = map_engine_error(sdk, "unix:///e.sock", _instance(cls), not_found, api_error)
        assert isinstance(mapped, CouldNotRunError), cls
        assert sdk in mapped.reason and "unix:///e.sock" in mapped.reason, cls
        if issubclass(cls, not_found):
            assert mapped.retryable is False, cls


def test_transport_failures_are_unreachable_and_retryable() -> None:
    for exc in (requests.exceptions.ConnectionError("refused"), FileNotFoundError(2, "missing"),
                ConnectionRefusedError(111, "refused"),
                docker.errors.DockerException("Error while fetching server API version: Connection aborted")):
        mapped = map_engine_error("docker", "unix:///e.sock", exc, docker_backend._NOT_FOUND,
                                  docker.errors.APIError)
        assert mapped.reason.startswith("docker engine unreachable at unix:///e.sock")
        assert mapped.retryable is True


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
