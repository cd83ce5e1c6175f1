"""The command line and ``serve --stdio`` as real subprocesses: one call, a server to talk to line by line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

TOOLSEAM = [sys.executable, "-m", "toolseam.frontends.cli"]
"""The command line as a subprocess runs it (``python -m``: the checkout's code)."""


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TOOLSEAM, *args], capture_output=True, text=True, cwd=cwd, timeout=60)

class Server:
    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([*TOOLSEAM, "serve", "--stdio", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def send(self, message: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
        self.proc.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the server closed its output"
        return json.loads(line)  # type: ignore[no-any-return]

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *_: object) -> None:  # a failed assertion must not leak the server
        if self.proc.poll() is None:
            self.proc.kill()
        self.finish()

    def finish(self) -> int:
        code = self.proc.wait(timeout=10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()
        return code

    def read_until(self, predicate: Any) -> list[dict[str, Any]]:
        seen = []
        while True:
            message = self.read()
            seen.append(message)
            if predicate(message):
                return seen
