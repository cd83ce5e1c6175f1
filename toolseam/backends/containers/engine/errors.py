"""What an engine call can fail with, as types — mapped once, from the SDK's exception types and
the HTTP status the engine answered, never from the words of its message.

    CouldNotRunError                the seam's could-not-run (``retryable`` says if asking again may help)
    └── EngineError                 an engine call failed (a 5xx, or anything unforeseen): retryable
        ├── EngineUnreachable       no connection to the engine (refused, reset, no socket): retryable
        ├── EngineNotFound          no such container, volume or image (404): not retryable
        ├── EngineConflict          the name is taken, the container is in the wrong state (409)
        └── EnginePermanent         the engine refused the request itself (another 4xx)

Subclasses of the seam's ``CouldNotRunError``: a caller that only knows the seam sees the same
could-not-run as before; engine code catches the one kind it expects (``EngineNotFound`` when
removing what may be gone).
"""

from __future__ import annotations

from dataclasses import dataclass

import requests

from ....seam.errors import CouldNotRunError
from ....seam.models import CouldNotRunCause


class EngineError(CouldNotRunError):
    """An engine call failed."""

    retryable_by_default = True
    cause_by_default: CouldNotRunCause = "engine_error"

    def __init__(self, reason: str) -> None:
        super().__init__(reason, retryable=self.retryable_by_default,
                         cause=self.cause_by_default)


class EngineUnreachable(EngineError):
    """No connection to the engine."""

    cause_by_default: CouldNotRunCause = "engine_unreachable"


class EngineNotFound(EngineError):
    """No such container, volume or image."""

    retryable_by_default = False


class EngineConflict(EngineError):
    """The request conflicts with the engine's state (a name in use, a container stopping)."""

    retryable_by_default = False


class EnginePermanent(EngineError):
    """The engine refused the request itself: asking again cannot help."""

    retryable_by_default = False


@dataclass(frozen=True)
class SdkErrors:
    """An SDK's exception types: what its calls raise, and which of them mean "not found"."""

    base: tuple[type[Exception], ...]
    not_found: tuple[type[Exception], ...]

    @property
    def caught(self) -> tuple[type[Exception], ...]:
        """What an engine call may raise: the SDK's errors and the transport's."""
        return (*self.base, OSError)


_TRANSPORT = (requests.exceptions.ConnectionError, ConnectionError, FileNotFoundError)


def http_status(exc: BaseException) -> int | None:
    """The HTTP status an engine answered with, for an SDK error or a ``requests`` one."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return status
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def map_engine_error(engine: str, endpoint: str, exc: Exception, sdk: SdkErrors, *,
                     connecting: bool = False) -> EngineError:
    """Every SDK / transport failure as the engine error it is (mapped once, here).
    ``connecting``: raised while the client was being made — whatever it is, no engine answered."""
    explanation = getattr(exc, "explanation", None) or exc
    status = http_status(exc)
    if isinstance(exc, _TRANSPORT) or (connecting and status is None):
        return EngineUnreachable(f"{engine} engine unreachable at {endpoint}: {exc}")
    where = f"{engine} at {endpoint}"
    if isinstance(exc, sdk.not_found) or status == 404:
        return EngineNotFound(f"{where}: not found: {explanation}")
    if status == 409:
        return EngineConflict(f"{where}: {explanation}")
    if status is not None and 400 <= status < 500:
        return EnginePermanent(f"{where}: {explanation}")
    return EngineError(f"{where}: {explanation}")
