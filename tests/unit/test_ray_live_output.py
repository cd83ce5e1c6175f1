"""The node's side of live output through Ray (``toolseam/ray/streaming.py``), above the seam
on the in-process fake backend: batches in order, the end riding with the last output, a
caller that falls behind bounding what the node keeps, a cancel ending the job."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam.backends.agentlink.errors import map_seam_error
from toolseam.ray import streaming
from toolseam.seam.errors import HostError
from toolseam.seam.models import OutputChunk, SpawnRequest
from toolseam.testing.fake import FakeBackend


def spawn(script: str, job: str = "j1") -> SpawnRequest:
    return SpawnRequest(job=job, argv=["/bin/sh", "-c", script], cwd="/workspace", env={},
                        stream=True)


async def drain(live: streaming.LiveStarts, job: str = "j1") -> tuple[list[str], Any]:
    texts: list[str] = []
    while True:
        chunks, final = await live.next("s", job)
        texts += [chunk.text for chunk in chunks]
        if final is not None:
            return texts, final


async def test_a_short_command_is_one_batch_with_its_end() -> None:
    live = streaming.LiveStarts()
    live.begin("s", FakeBackend("/workspace"), spawn("echo a; echo b >&2; exit 3"))
    chunks, final = await live.next("s", "j1")
    assert chunks == [OutputChunk(stream="stdout", text="a\n"),
                      OutputChunk(stream="stderr", text="b\n")]
    assert final is not None and final[0] == "ok" and final[1].exit_code == 3
    with pytest.raises(HostError, match="no streamed start"):  # forgotten once answered
        await live.next("s", "j1")


async def test_output_before_a_pause_comes_before_the_pause_ends() -> None:
    live = streaming.LiveStarts()
    live.begin("s", FakeBackend("/workspace"), spawn("echo early; sleep 0.5; echo late"))
    chunks, final = await asyncio.wait_for(live.next("s", "j1"), 0.3)
    assert ([c.text for c in chunks], final) == (["early\n"], None)
    texts, final = await drain(live)
    assert texts == ["late\n"] and final[1].exit_code == 0


async def test_a_caller_that_falls_behind_bounds_what_the_node_keeps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A command floods while nobody fetches: the node keeps at most UNREAD_CHARS of it; the
    result's capture is whole all the same."""
    monkeypatch.setattr(streaming, "UNREAD_CHARS", 100)
    live = streaming.LiveStarts()
    line = "x" * 29  # 30 characters with its newline
    live.begin("s", FakeBackend("/workspace"), spawn("; ".join([f"echo {line}"] * 20)))
    await asyncio.sleep(0.05)  # the command has ended; nothing was fetched
    texts, final = await drain(live)
    assert texts == [line + "\n"] * 3
    assert final[1].output == (line + "\n") * 20


async def test_cancel_forgets_the_start_and_a_wrong_job_is_named() -> None:
    """A cancelled caller's start is cancelled on the node as a cancelled local ``start`` is
    (the job itself is the caller's to kill: the bash tool does, ``_abandon``)."""
    backend = FakeBackend("/workspace")
    live = streaming.LiveStarts()
    live.begin("s", backend, spawn("echo go; sleep 30"))
    with pytest.raises(HostError, match="being started already"):
        live.begin("s", backend, spawn("echo twice"))
    assert (await live.next("s", "j1"))[1] is None
    started = live._live[("s", "j1")].started
    live.cancel("s", "j1")
    await asyncio.gather(started, return_exceptions=True)
    assert started.cancelled()
    with pytest.raises(HostError, match="no streamed start of job 'j1'"):
        await live.next("s", "j1")
    assert (await backend.kill("j1")).killed


async def test_closing_a_session_cancels_all_its_starts_only() -> None:
    backend = FakeBackend("/workspace")
    live = streaming.LiveStarts()
    for sid, job in (("s", "a"), ("s", "b"), ("t", "a")):
        live.begin(sid, backend if sid == "s" else FakeBackend("/workspace"),
                   spawn("sleep 30", job))
    started = [live._live[key].started for key in (("s", "a"), ("s", "b"))]
    live.cancel("s")
    assert set(live._live) == {("t", "a")}
    await asyncio.gather(*started, return_exceptions=True)
    assert all(task.cancelled() for task in started)
    live.cancel("t")
    assert not live._live


STEPS = st.lists(st.one_of(
    st.tuples(st.just("echo"), st.text("abcxyz019", min_size=1, max_size=12),
              st.sampled_from(["", " >&2"])),
    st.tuples(st.just("sleep"), st.sampled_from(["0", "0.001", "0.03"]), st.just(""))),
    max_size=12)


@settings(max_examples=40, deadline=None)
@given(steps=STEPS, fetch_pause=st.sampled_from([0.0, 0.002, 0.04]),
       cap=st.sampled_from([10, 40, 1 << 20]))
def test_what_arrives_is_the_output_in_order_within_the_cap(
        steps: list[tuple[str, str, str]], fetch_pause: float, cap: int) -> None:
    """Whatever the command's rhythm and the caller's: the chunks fetched are the command's
    own, in order, each whole; all of them while the caller keeps under the cap; the answer
    comes once, last, with the whole capture."""
    script = "; ".join(f"{verb} {arg}{tail}" for verb, arg, tail in steps) or "true"

    async def run() -> None:
        previous = streaming.UNREAD_CHARS
        streaming.UNREAD_CHARS = cap
        try:
            live = streaming.LiveStarts()
            live.begin("s", FakeBackend("/workspace"), spawn(script))
            fetched: list[OutputChunk] = []
            while True:
                chunks, final = await live.next("s", "j1")
                fetched += chunks
                if final is not None:
                    break
                await asyncio.sleep(fetch_pause)
        finally:
            streaming.UNREAD_CHARS = previous
        produced = final[1].chunks
        it = iter(produced)
        assert all(chunk in it for chunk in fetched)  # a subsequence, in order
        if sum(len(c.text) for c in produced) <= cap:
            assert fetched == produced
        assert not live._live
    asyncio.run(run())


async def following(live: streaming.LiveStarts, backend: FakeBackend, request: SpawnRequest,
                    on_output: Any) -> Any:
    """A caller's ``follow`` of a streamed start with no cluster between: straight into the
    node's side (begin, next, cancel); the status, or the failure raised."""
    async def first() -> streaming.Batch:
        live.begin("s", backend, request)
        return await live.next("s", request.job)

    async def cancel() -> None:
        live.cancel("s", request.job)

    answer = await streaming.follow(first, lambda: live.next("s", request.job), cancel,
                                    on_output)
    if answer[0] != "ok":
        raise map_seam_error(answer[1])
    return answer[1]


async def test_the_caller_hands_each_batch_on_and_returns_the_status() -> None:
    live, got = streaming.LiveStarts(), list[OutputChunk]()
    status = await following(live, FakeBackend("/workspace"),
                             spawn("echo a; sleep 0.1; echo b >&2; exit 2"), got.append)
    assert [(c.stream, c.text) for c in got] == [("stdout", "a\n"), ("stderr", "b\n")]
    assert status.exit_code == 2 and not live._live


async def test_a_cancelled_caller_ends_the_start_on_the_node() -> None:
    live, first = streaming.LiveStarts(), asyncio.Event()
    backend = FakeBackend("/workspace")
    caller = asyncio.ensure_future(following(
        live, backend, spawn("echo go; sleep 30"), lambda c: first.set()))
    await asyncio.wait_for(first.wait(), 1)
    started = live._live[("s", "j1")].started
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.gather(started, return_exceptions=True)  # live_cancel reached the node
    assert started.cancelled() and not live._live
    await backend.kill("j1")


async def test_a_remote_streams_events_are_never_dropped_nor_held_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A remote stream's events other than output (the egress stream's frames) are each
    delivered, past the output cap, and a batch of them does not wait for the call's end."""
    monkeypatch.setattr(streaming, "UNREAD_CHARS", 10)
    monkeypatch.setattr(streaming, "LINGER_S", 5.0)  # held back, a batch would wait this long
    live, go_on = streaming.LiveStarts(), asyncio.Event()

    async def run(emit: Any) -> Any:
        for number in range(50):
            emit({"c": number, "d": b"x" * 100})
        await go_on.wait()
        return ("ok", "done")

    live.begin_call("s", "stream-1", run)
    events, final = await asyncio.wait_for(live.next("s", "stream-1"), 1.0)
    assert final is None and [e["c"] for e in events] == list(range(50))
    go_on.set()
    assert await live.next("s", "stream-1") == ([], ("ok", "done"))


async def test_a_cancelled_remote_stream_answers_in_its_routes_error_shape() -> None:
    live = streaming.LiveStarts(lambda exc: ("err", {"kind": "host", "message": str(exc)}))

    async def run(emit: Any) -> Any:
        emit("first")
        await asyncio.sleep(30)
        return ("ok", None)

    live.begin_call("s", "stream-1", run)
    assert await live.next("s", "stream-1") == (["first"], None)
    live._live[("s", "stream-1")].started.cancel()
    events, final = await live.next("s", "stream-1")
    assert events == [] and final == ("err", {"kind": "host", "message":
                                              "the streamed call was cancelled on the node"})


async def test_a_caller_whose_callback_fails_ends_the_call_on_the_node() -> None:
    """``on_event`` raising stops the caller; the node's call is cancelled, not left running
    for nobody."""
    live = streaming.LiveStarts()
    backend = FakeBackend("/workspace")
    began: list[asyncio.Future[Any]] = []
    begin_call = live.begin_call

    def recording(sid: str, name: str, run: streaming.Run) -> None:
        begin_call(sid, name, run)
        began.append(live._live[(sid, name)].started)
    live.begin_call = recording  # type: ignore[method-assign]

    def broken(_: OutputChunk) -> None:
        raise RuntimeError("the caller's callback broke")

    with pytest.raises(RuntimeError, match="callback broke"):
        await following(live, backend, spawn("echo go; sleep 30"), broken)
    await asyncio.wait(began, timeout=2)  # the cancel is a task of its own (wait cancels none)
    assert began[0].cancelled() and not live._live
    await backend.kill("j1")
