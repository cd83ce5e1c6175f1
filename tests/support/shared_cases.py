"""One sandbox for all the parameters of a contract case that only reads or is refused
(docs/testing.md, "Suite time"; decision 406).

The contract suite opens a sandbox per test: on an engine a container and its agent, about
0.5 s to open and close with two workers busy. Eight of its cases are tables (``parametrize``)
whose rows each put files of their own name, read them or are refused, and change nothing
the next row reads: on a container binding they were 28 opens per class for what one open
per case serves. Mixed in before a binding, ``SharedParameterSandbox`` gives the rows of
each case in ``SHARED_CASES`` one sandbox (opened for its first row, closed before the next
case or at the class's end); every other case still opens its own. Every row still runs and
asserts the same thing on every backend; what a row meets is the sandbox the rows before it
used, which a row of these cases cannot break (a row that did would fail, and so would the
next ones: never a false pass). Not shared: the cases that close their toolkit (the backend
with it), kill processes or leave jobs, and the read-only file case (it chmods a shared name).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from toolseam import Toolkit
from toolseam.testing.contract import Sandbox

SHARED_CASES = frozenset({
    # FileContract: each row puts its own file (or none) and reads it, or is refused
    "test_read_failures_have_codes", "test_confinement_refuses_escapes",
    # ExecContract: a flood on one stream, released; JobContract: a fresh toolkit per row
    "test_flood_counts_are_exact_on_either_stream", "test_forms_are_validated",
    # HostileContract: a refused input, then the session shown alive (fresh toolkit per row)
    "test_invalid_input_is_a_tool_error_and_the_session_lives",
    # ReadToolContract: each row reads a file of its own name
    "test_an_image_is_known_by_its_bytes_whatever_its_name",
    "test_unsupported_image_types_fall_through_to_text",
    "test_bmp_and_tiff_bytes_are_binary_and_named",
})


async def _release(held: dict[str, Any]) -> None:
    stack = held.pop("stack", None)
    held.clear()
    if stack is not None:
        await stack.aclose()


class SharedParameterSandbox:
    """The rows of a ``SHARED_CASES`` case share one sandbox; the class runs in one event loop
    (the shared sandbox's connections belong to the loop that opened it)."""

    pytestmark = [pytest.mark.asyncio(loop_scope="class")]

    # the suite's, after this class in the method order (an annotation only: no attribute)
    opened: Callable[[Path], contextlib.AbstractAsyncContextManager[Sandbox]]

    @pytest_asyncio.fixture(scope="class", loop_scope="class")
    @classmethod
    async def _held_sandbox(cls) -> AsyncIterator[dict[str, Any]]:
        held: dict[str, Any] = {}
        yield held
        await _release(held)

    @pytest_asyncio.fixture(loop_scope="class")
    async def sandbox(self, request: pytest.FixtureRequest, tmp_path: Path,
                      _held_sandbox: dict[str, Any]) -> AsyncIterator[Sandbox]:
        case = request.node.originalname  # type: ignore[attr-defined]
        if case not in SHARED_CASES:
            await _release(_held_sandbox)
            async with self.opened(tmp_path) as own:
                yield own
            return
        if _held_sandbox.get("case") != case:
            await _release(_held_sandbox)
            stack = contextlib.AsyncExitStack()
            opened = await stack.enter_async_context(self.opened(tmp_path))
            _held_sandbox.update(case=case, stack=stack, sandbox=opened)
        yield _held_sandbox["sandbox"]

    @pytest_asyncio.fixture(loop_scope="class")
    async def toolkit(self, sandbox: Sandbox) -> AsyncIterator[Toolkit]:
        """``ReadToolContract``'s toolkit, in the class's loop."""
        toolkit = Toolkit(sandbox.backend, base_dir=sandbox.base)
        await toolkit.open()
        yield toolkit
