"""Interactive processes over the agent's channel: the ``InteractiveProcesses`` capability of
every agent-run backend (``ComposedBackend`` mixes this in).

Each call is one request of the agent's op table (``toolseam_agent/pty_ops.py``), so it goes
through the same liveness checks, reconnects and — for a durable session — the same sealed
channel as a bash call; the processes are the agent's, so they outlive a detach like jobs do.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from toolseam_agent import wire

from ...seam.errors import FileOpError, UnknownJobError
from ...seam.interactive import PtyOutput, PtyProcess, UnknownProcessError
from .channel import AgentChannel

T = TypeVar("T")
P = ParamSpec("P")


class AgentInteractive:
    """The ``pty_*`` methods; the host class brings ``_run``, ``_agent`` and ``open``."""

    async def _run(self, call: Callable[P, Awaitable[T]], *args: P.args,
                   **kwargs: P.kwargs) -> T:
        raise NotImplementedError

    def _agent(self) -> AgentChannel:
        raise NotImplementedError

    async def _pty_call(self, op: str, **fields: Any) -> dict[str, Any]:
        async def call() -> dict[str, Any]:
            try:
                return await self._agent().call(op, **fields)
            except UnknownJobError as exc:
                raise UnknownProcessError(str(exc)) from None
        return await self._run(call)

    async def pty_start(self, argv: Sequence[str], cwd: str, env: Mapping[str, str],
                        rows: int, cols: int, tty: bool) -> int:
        spec = {"argv": list(argv), "cwd": cwd, "env": dict(env), "rows": rows, "cols": cols,
                "tty": tty}
        try:
            result = await self._pty_call(wire.PTY_START, spec=spec)
        except FileOpError as exc:  # the spawn failed in its cwd: name the cwd
            raise FileOpError(exc.code, cwd, exc.detail) from None
        return int(result["pty"])

    async def pty_write(self, pty: int, data: bytes) -> None:
        await self._pty_call(wire.PTY_WRITE, pty=pty,
                             data_b64=base64.b64encode(data).decode("ascii"))

    async def pty_read(self, pty: int, yield_ms: int, max_bytes: int) -> PtyOutput:
        got = await self._pty_call(wire.PTY_READ, pty=pty, yield_ms=yield_ms,
                                   max_bytes=max_bytes)
        return PtyOutput(data=base64.b64decode(got["data_b64"]), exited=bool(got["exited"]),
                         exit_code=got.get("exit_code"), truncated_bytes=int(got["dropped"]))

    async def pty_resize(self, pty: int, rows: int, cols: int) -> None:
        await self._pty_call(wire.PTY_RESIZE, pty=pty, rows=rows, cols=cols)

    async def pty_terminate(self, pty: int) -> int | None:
        code = (await self._pty_call(wire.PTY_TERMINATE, pty=pty)).get("exit_code")
        return None if code is None else int(code)

    async def pty_list(self) -> list[PtyProcess]:
        found = (await self._pty_call(wire.PTY_LIST))["ptys"]
        return [PtyProcess(id=p["pty"], pid=p["pid"], argv=p["argv"],
                           running=p["state"] == "running", tty=p["tty"], started=p["started"])
                for p in found]
