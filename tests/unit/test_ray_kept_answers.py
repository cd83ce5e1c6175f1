"""The node actor's kept answers of tokened direct calls (``ray/node_remote.py``, ``_keep``):
the newest ended ones within ``KEPT_MAX`` calls and ``KEPT_BYTES`` of output, never one still
running — with the kept bytes counted as calls end, not summed again per call."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam.ray import node_remote
from toolseam.ray.node_remote import NodeRemote

# each step: start a call with this output size, or end the oldest running one
steps = st.lists(st.one_of(st.integers(0, 60), st.just(-1)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_kept_answers_stay_within_their_caps_and_keep_every_running_call(
        plan: list[int]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(node_remote, "KEPT_MAX", 4)
        patch.setattr(node_remote, "KEPT_BYTES", 100)
        asyncio.run(_run(plan))


async def _run(plan: list[int]) -> None:
    node = NodeRemote()
    loop = asyncio.get_running_loop()
    running: list[tuple[str, asyncio.Future[object], int]] = []
    ended: list[str] = []  # in the order they ended
    for n, step in enumerate(plan):
        if step >= 0:
            call: asyncio.Future[object] = loop.create_future()
            node._keep(f"t{n}", b"key", call)  # type: ignore[arg-type]
            running.append((f"t{n}", call, step))
        elif running:
            token, call, size = running.pop(0)
            call.set_result(("ok", SimpleNamespace(stdout_bytes=size)))
            ended.append(token)
        await asyncio.sleep(0)  # the done callbacks run
        kept = node._kept or {}
        sizes = node._kept_sizes or {}
        assert all(token in kept for token, _, _ in running)
        assert node._kept_bytes == sum(sizes[t] for t in kept if t in sizes)
        assert set(sizes) <= set(kept)
        kept_ended = [t for t in ended if t in kept]
        assert kept_ended == ended[len(ended) - len(kept_ended):]  # the newest ones
        if step < 0:  # a call ended: within both caps, or no ended answer is left to let go
            assert (len(kept) <= 4 and node._kept_bytes <= 100) or not kept_ended


def test_an_answer_is_let_go_when_its_time_is_over() -> None:
    async def run() -> None:
        node = NodeRemote()
        call: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        node._keep("t", b"key", call)  # type: ignore[arg-type]
        call.set_result(("ok", SimpleNamespace(stdout_bytes=7)))
        await asyncio.sleep(0)
        assert node._kept_bytes == 7
        await asyncio.sleep(0.05)
        assert "t" not in (node._kept or {}) and node._kept_bytes == 0

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(node_remote, "KEPT_S", 0.01)
        asyncio.run(run())
