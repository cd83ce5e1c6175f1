"""``toolseam serve --stdio`` reads its requests from whatever stdin is: a pipe, a regular file
(``< requests.jsonl``) or ``/dev/null``. A file failed at start ("Pipe transport is for
pipes/sockets only") and ``/dev/null`` hung the server for good (epoll refuses it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _serve(stdin: Any, work: Path, timeout: float = 60) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "toolseam", "serve", "--stdio", "--base-dir",
                           str(work)], stdin=stdin, capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_dev_null_is_an_empty_session(tmp_path: Path) -> None:
    with open(os.devnull, "rb") as empty:
        assert _serve(empty, tmp_path, timeout=30) == [{"op": "closed"}]


def test_requests_from_a_file_are_each_answered(tmp_path: Path) -> None:
    requests = tmp_path / "requests.jsonl"
    lines = [{"id": 0, "tool": "write", "args": {"path": "a.txt", "content": "hi\n"}}]
    lines += [{"id": n, "tool": "read", "args": {"path": "a.txt"}} for n in range(1, 300)]
    requests.write_text("".join(json.dumps(line) + "\n" for line in lines))
    work = tmp_path / "work"
    work.mkdir()
    with open(requests, "rb") as stdin:
        answers = _serve(stdin, work)
    by_id = {a["id"]: a for a in answers if "id" in a}
    assert sorted(by_id) == list(range(300)) and answers[-1] == {"op": "closed"}
    assert by_id[299]["result"]["output"].startswith("00001| hi")


def test_a_close_request_ends_the_server_before_the_file_does(tmp_path: Path) -> None:
    """The thread copying a file in must not keep the process alive once it stops reading."""
    requests = tmp_path / "requests.jsonl"
    with open(requests, "w") as out:
        out.write(json.dumps({"op": "close"}) + "\n")
        out.write((json.dumps({"id": 1, "tool": "read", "args": {"path": "x"}}) + "\n") * 200_000)
    with open(requests, "rb") as stdin:
        answers = _serve(stdin, tmp_path, timeout=30)
    assert answers == [{"op": "closed"}]
