"""Durable sessions in tests: what an attach needs besides the handle."""

from __future__ import annotations

from toolseam.backends.containers.engine.attach import TlsFiles

from .engines import required_env


def attach_options(engine: str) -> dict[str, object]:
    """What a handle does not carry: a TLS engine's client files."""
    if engine != "docker-remote":
        return {}
    return {"backend_options": {"tls": TlsFiles.from_dir(
        required_env("TOOLSEAM_REMOTE_DOCKER_CERT_PATH", engine))}}
