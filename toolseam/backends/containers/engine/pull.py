"""Images on demand: the pull policy, and what a failed pull means.

``never`` uses only what the engine has; ``missing`` (the default, as ``docker run``) pulls an
image the engine lacks; ``always`` pulls before every session, so a re-pushed tag is picked
up. Pulls go through the engine's API with the engine's own credentials (docker's
``config.json``, containers' ``auth.json``) unless the host passes ``auth`` explicitly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import requests

from ....seam.errors import CouldNotRunError

PullPolicy = Literal["never", "missing", "always"]
PULL_POLICIES: tuple[PullPolicy, ...] = ("never", "missing", "always")


@dataclass(frozen=True)
class PullProgress:
    """One progress report of a pull, as the engine gave it."""

    image: str
    status: str  # "Downloading", "Pull complete", …
    layer: str | None = None
    current: int | None = None  # bytes of this layer so far
    total: int | None = None


PullCallback = Callable[[PullProgress], None]


def split_reference(image: str) -> tuple[str, str]:
    """``repo[:tag]`` or ``repo@digest`` → (repository, tag or digest) for the SDKs."""
    if "@" in image:
        repo, _, digest = image.partition("@")
        return repo, digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon + 1:]
    return image, "latest"


def registry_of(image: str) -> str:
    first = image.split("/", 1)[0]
    if "/" in image and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


# A failed pull, in the engines' own words -> whether asking again can help.
_PERMANENT = ("unauthorized", "authentication required", "denied", "manifest unknown",
              "not found", "name unknown", "invalid reference", "does not exist",
              "no basic auth credentials")


def pull_failure(engine: str, image: str, message: str) -> CouldNotRunError:
    """Unreachable, timed out or 5xx: retryable. Unknown tag, unauthorized, invalid
    reference: not. The reason names the image and the registry."""
    text = message.lower()
    permanent = any(words in text for words in _PERMANENT)
    return CouldNotRunError(
        f"{engine} could not pull {image!r} from {registry_of(image)}: {message.strip()}",
        retryable=not permanent, cause="image_missing" if permanent else "engine_unreachable")


def progress_of(image: str, event: dict[str, Any]) -> PullProgress:
    detail = event.get("progressDetail") or {}
    return PullProgress(image=image, status=str(event.get("status") or event.get("stream") or ""),
                        layer=event.get("id"), current=detail.get("current"),
                        total=detail.get("total"))


def follow_pull(engine: str, endpoint: str, image: str, start: Callable[[], Iterator[dict[str, Any]]],
                sdk_errors: tuple[type[Exception], ...], on_progress: PullCallback | None) -> None:
    """Read an engine's pull stream to its end: progress to ``on_progress``, an error event or
    an SDK failure as the could-not-run it means; the stream is closed however it ends (one
    left half read keeps its connection open)."""
    events: Iterator[dict[str, Any]] | None = None
    caught: tuple[type[Exception], ...] = (*sdk_errors, requests.exceptions.RequestException)
    try:
        events = start()
        for event in events:
            if "error" in event:
                raise pull_failure(engine, image, str(event["error"]))
            if on_progress is not None:
                on_progress(progress_of(image, event))
    except caught as exc:
        message = str(getattr(exc, "explanation", None) or exc)
        if isinstance(exc, requests.exceptions.ConnectionError):
            message = f"{endpoint} unreachable: {exc}"
        raise pull_failure(engine, image, message) from None
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
