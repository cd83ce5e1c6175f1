"""Answers kept under a token (``backends/remote/kept_answers.py``; Ray's node actor keeps its
tokened direct calls' there, ``ray/node_remote.py``): the newest ended ones within
``KEPT_MAX`` calls and ``KEPT_BYTES`` of output, never one still running — the kept bytes
counted as calls end, not summed again per call; a collect that comes before its request
waits for it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam.backends.remote import kept_answers
from toolseam.backends.remote.codec import loads
from toolseam.backends.remote.handshake import derived_key
from toolseam.backends.remote.kept_answers import KeptAnswers
from toolseam.backends.remote.server import SESSION_LABEL
from toolseam.ray.node_remote import NodeRemote

# each step: start a call with this output size, or end the k-th oldest running one (-k):
# calls end in another order than they began, and the first to end are let go first
steps = st.lists(st.one_of(st.integers(0, 60), st.integers(-4, -1)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_kept_answers_stay_within_their_caps_and_keep_every_running_call(
        plan: list[int]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kept_answers, "KEPT_MAX", 4)
        patch.setattr(kept_answers, "KEPT_BYTES", 100)
        asyncio.run(_run(plan))


async def _run(plan: list[int]) -> None:
    node = KeptAnswers()
    loop = asyncio.get_running_loop()
    running: list[tuple[str, asyncio.Future[object], int]] = []
    ended: list[str] = []  # in the order they ended
    for n, step in enumerate(plan):
        if step >= 0:
            call: asyncio.Future[object] = loop.create_future()
            node.keep(f"t{n}", b"key", call)
            running.append((f"t{n}", call, step))
        elif running:
            token, call, size = running.pop((-step - 1) % len(running))
            call.set_result(("ok", SimpleNamespace(stdout_bytes=size)))
            ended.append(token)
        await asyncio.sleep(0)  # the done callbacks run
        kept, sizes = node.kept, node.sizes
        assert all(token in kept for token, _, _ in running)
        assert node.kept_bytes == sum(sizes[t] for t in kept if t in sizes)
        assert set(sizes) <= set(kept)
        kept_ended = [t for t in ended if t in kept]
        assert kept_ended == ended[len(ended) - len(kept_ended):]  # the newest ones
        if step < 0:  # a call ended: within both caps, or no ended answer is left to let go
            assert (len(kept) <= 4 and node.kept_bytes <= 100) or not kept_ended


def test_an_answer_is_let_go_when_its_time_is_over() -> None:
    async def run() -> None:
        node = KeptAnswers()
        call: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        node.keep("t", b"key", call)
        call.set_result(("ok", SimpleNamespace(stdout_bytes=7)))
        await asyncio.sleep(0)
        assert node.kept_bytes == 7
        await asyncio.sleep(0.05)
        assert "t" not in node.kept and node.kept_bytes == 0

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kept_answers, "KEPT_S", 0.01)
        asyncio.run(run())


def _collect(node: NodeRemote, token: str) -> asyncio.Task[bytes]:
    return asyncio.ensure_future(node.remote_collect("sid", "the secret", token))


def test_a_collect_that_comes_before_its_request_waits_for_it() -> None:
    """The caller hands a call still running after its grace to its waiter, which collects
    it — under load, before the node has read the request off its port. The collect waits for
    it (it answered "not kept" at once before: a ``SandboxExecError`` at ``ray.get``)."""
    async def run() -> None:
        node = NodeRemote()
        node.where = "node test"
        early = _collect(node, "t1")
        await asyncio.sleep(0.05)
        assert not early.done()
        call: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        node._answers.keep("t1", derived_key("the secret", SESSION_LABEL), call)
        call.set_result(("ok", "done"))
        assert loads(await asyncio.wait_for(early, 5)) == ("ok", "done")
        assert not node._answers.awaited
    asyncio.run(run())


def test_a_request_that_never_comes_is_said_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept_answers, "ARRIVAL_S", 0.05)

    async def run() -> None:
        node = NodeRemote()
        node.where = "node test"
        answer = loads(await asyncio.wait_for(_collect(node, "never"), 5))
        assert answer[0] == "err" and "did not come within" in str(answer[1])
        assert not node._answers.awaited  # nothing left waiting
    asyncio.run(run())
