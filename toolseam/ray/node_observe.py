"""What a node actor adds to observability (issue 49, decision 390): each call that came with
its caller's trace context is a ``toolseam node {method}`` span, the child of the caller's
span, made through the node's own telemetry (configured in the node's environment, the
standard way); the node counts its open sessions; and an operator's ``toolseam ps --kill``
ends a session's sandbox here, through its holder."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from ..observability.across import continued, count_session
from .direct import Answer


def remote_error_kind(answer: Answer) -> str | None:
    """A remote ``("err", error answer)``'s ``error.type`` (``agentlink/errors.py``'s shape):
    a could-not-run's cause, a host error's code, a file operation's ``file_op``."""
    if not (answer[:1] == ("err",) and len(answer) == 2 and isinstance(answer[1], dict)):
        return None
    error = answer[1]
    kind = str(error.get("kind"))
    if kind == "could_not_run":
        return str(error.get("cause") or "other")
    if kind == "host":
        return str(error.get("code") or "host")
    return "file_op" if kind == "fs" else kind


class NodeTelemetry:
    """The node's side of a trace: its spans carry which node and engine did the work."""

    def __init__(self, node_id: str, name: str, engine: str) -> None:
        self.attributes: dict[str, Any] = {"toolseam.node": node_id,
                                           "toolseam.ray.node.name": name,
                                           "toolseam.backend": engine}

    async def remote(self, came: object, request: object,
                     run: Callable[[], Awaitable[Answer]]) -> Answer:
        """A remote request's answer (``node_remote.py``), spanned by its operation's name
        when its caller sent a trace context."""
        if came is None:
            return await run()
        name, sid = (str(request[2]), str(request[0])) if (
            isinstance(request, tuple) and len(request) == 5) else ("request", "")
        with continued(came, f"toolseam node {name}",
                       {**self.attributes, "toolseam.ray.session.id": sid}) as fail:
            answer = await run()
            kind = remote_error_kind(answer)
            if kind is not None:
                fail(kind)
            return answer

    def sessions_changed(self, delta: int) -> None:
        count_session(delta, self.attributes)
