"""Properties of the raw sandbox API over its input space, on the host backend (real agent,
real processes): any argv comes back verbatim (never parsed by a shell), any stdin bytes reach
the command unchanged, any file bytes round-trip, and any output limit keeps exactly that many
bytes per stream with an honest truncation flag."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolseam import Toolkit

ARG = st.text(st.characters(exclude_characters="\0", exclude_categories=("Cs",)), max_size=30)


class Session:
    """One toolkit on one loop for every example (an agent per example would dominate)."""

    def __init__(self, base: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.toolkit = Toolkit("host", base_dir=str(base), tools={"bash": False})
        self.run(self.toolkit.open())

    def run(self, call: Any) -> Any:
        return self.loop.run_until_complete(call)

    def close(self) -> None:
        self.run(self.toolkit.close())
        self.loop.close()


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    made = Session(tmp_path_factory.mktemp("raw"))
    yield made
    made.close()


SLOW_FIXTURE = [HealthCheck.function_scoped_fixture]


@given(st.lists(ARG, max_size=8))
@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_FIXTURE)
def test_argv_comes_back_verbatim(session: Session, words: list[str]) -> None:
    done = session.run(session.toolkit.sandbox.exec(["printf", "%s\\0", *words]))
    got = done.stdout.split("\0")[:-1] if words else []
    assert done.success and got == words


@given(st.binary(max_size=4096))
@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_FIXTURE)
def test_stdin_bytes_reach_the_command_unchanged(session: Session, data: bytes) -> None:
    sandbox = session.toolkit.sandbox
    assert session.run(sandbox.exec(["sh", "-c", "cat > stdin.bin"], stdin=data)).success
    assert session.run(sandbox.read_bytes("stdin.bin")) == data


@given(st.binary(max_size=4096), st.sampled_from(["f", "a/b/f", "with space/ü.bin"]))
@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_FIXTURE)
def test_file_bytes_round_trip(session: Session, data: bytes, path: str) -> None:
    sandbox = session.toolkit.sandbox
    session.run(sandbox.write_bytes(path, data))
    assert session.run(sandbox.read_bytes(path)) == data
    assert session.run(sandbox.exec(["cat", path])).stdout == data.decode("utf-8", "replace")


@given(st.integers(0, 3000), st.integers(2, 2000))
@settings(max_examples=60, deadline=None, suppress_health_check=SLOW_FIXTURE)
def test_output_limit_keeps_that_many_bytes(session: Session, size: int, limit: int) -> None:
    done = session.run(session.toolkit.sandbox.exec(
        ["sh", "-c", f"head -c {size} /dev/zero | tr '\\0' x"], output_limit=limit))
    assert done.stdout_bytes == size
    assert done.stdout_truncated == (size > limit)
    assert len(done.stdout) == min(size, limit)
