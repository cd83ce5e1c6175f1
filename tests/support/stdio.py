"""A ``serve --stdio`` process spoken to in raw bytes, as a buggy or hostile client would."""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

from .cli import TOOLSEAM


def _no_constant(name: str) -> Any:
    raise AssertionError(f"the server wrote {name}, which is not JSON")


class RawServer:
    """The server over byte pipes: what it writes is checked as bytes (UTF-8) before JSON."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([*TOOLSEAM, "serve", "--stdio", *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def send_raw(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message: Any) -> None:
        self.send_raw(json.dumps(message).encode() + b"\n")

    def read(self, timeout: float = 60) -> dict[str, Any]:
        assert self.proc.stdout is not None
        result: list[bytes] = []
        reader = threading.Thread(target=lambda: result.append(self.proc.stdout.readline()),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()
        reader.join(timeout)
        assert result and result[0], "no answer (the server hung or closed its output)"
        text = result[0].decode("utf-8")  # strict: invalid UTF-8 fails here
        message = json.loads(text, parse_constant=_no_constant)
        assert isinstance(message, dict)
        return message

    def answer(self) -> dict[str, Any]:
        """The next line that is not live output."""
        while (message := self.read()).get("op") == "output":
            pass
        return message

    def close(self) -> int:
        self.send({"op": "close"})
        assert self.answer() == {"op": "closed"}
        return self.finish()

    def finish(self) -> int:
        code = self.proc.wait(timeout=30)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        return code

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *_: object) -> None:  # a failed assertion must not leak the server
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish()
