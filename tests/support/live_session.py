"""A session held open in a process of its own, for ``toolseam ps`` and ``toolseam metrics``:
it prints its session id, runs ``: > started; sleep 30`` in its base dir, then prints the
call's outcome as JSON (``{"cause": ...}`` or ``{"result": ...}``) and exits.

Run as ``python -m tests.support.live_session BASE_DIR [ENGINE]``."""

from __future__ import annotations

import asyncio
import json
import sys

from toolseam import CouldNotRunError, SessionClosedError, Toolkit

from .engines import backend


async def main(base_dir: str, engine: str) -> None:
    chosen = "host" if engine == "host" else backend(engine, base_dir)
    tk = Toolkit(chosen, base_dir=base_dir if engine == "host" else None,
                 raise_could_not_run=True)
    await tk.open()
    print(tk.session_id, flush=True)
    try:
        await tk.call("bash", {"command": ": > started; sleep 30"})
        outcome: dict[str, object] = {"result": "ran"}
    except CouldNotRunError as exc:
        outcome = {"cause": exc.cause}
    except SessionClosedError:
        outcome = {"cause": "session_closed"}
    print(json.dumps(outcome), flush=True)
    await asyncio.gather(tk.close(), return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "host"))
