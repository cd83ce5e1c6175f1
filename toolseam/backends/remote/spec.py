"""What a client asks a remote server to host: a backend by its kind and options."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

# The kind that says "the server's own engine" (a Ray node's, known only once placed): the
# server's hosting resolves it; the client declares what every local kind has (decision 493).
PLACED = "placed"


class HostedSpec(BaseModel):
    """Which backend the server makes for a session: a kind of the name table and its options
    (plain values: they cross the wire as data)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = Field(description="A backend name of ``toolseam.backends.KINDS`` (host, podman, "
                      "docker), or ``placed``: the server's own engine.")
    options: dict[str, Any] = Field(default_factory=dict, description="Its keyword options, as "
                                    "``create_backend`` takes them.")
