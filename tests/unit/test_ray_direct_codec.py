"""The codec of a node's requests and answers (toolseam/backends/remote/codec.py, decisions 312, 336): what
crosses is rebuilt as builtin values and the seam's wire models only — never a callable or
another class, whatever the pickle asks for — and every model is validated again."""

from __future__ import annotations

import asyncio
import collections
import os
import pickle
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolseam.backends.remote.codec import MAX_REQUEST, dumps, loads
from toolseam.ray.direct import MAX_HELLO, read_frame, trace_context
from toolseam.seam.errors import HostError
from toolseam.seam.models import (
    ChangeSet,
    JobStatus,
    PathRef,
    SpawnRequest,
    TextContent,
    TraceContext,
)
from toolseam.seam.protocol import ExecRequest

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20)


@given(VALUES)
def test_builtin_values_cross_unchanged(value: Any) -> None:
    assert loads(dumps(value)) == value


def test_the_seams_models_cross_unchanged() -> None:
    models = [PathRef(base="/workspace", path="a b/ü.txt", confine=True),
              TextContent(text="x\n", size=2),
              SpawnRequest(job="j1", argv=["bash", "-c", "true"], cwd="/workspace",
                           env={"A": "1"}, stream=True),
              ExecRequest(job="j2", argv=["id"], cwd="/", env={}, user="nobody",
                          stdin_file="/tmp/in"),
              ChangeSet.model_validate({"base": "/w", "ops": [
                  {"op": "write", "path": "a", "data": b"x\0"},
                  {"op": "delete", "path": "b"}]})]
    for model in models:
        back = loads(dumps((1, "stat", (model,))))
        assert back == (1, "stat", (model,)) and type(back[2][0]) is type(model)
    assert JobStatus.__module__ == PathRef.__module__  # the answers' models are the same module


class Runs:
    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


@pytest.mark.parametrize("crafted", [
    Runs(os.system, "true"), Runs(eval, "1"), Runs(collections.OrderedDict),
    Runs(HostError, "not a model"), Runs(getattr, PathRef, "model_validate")],
    ids=["os.system", "eval", "another class", "an exception", "a model's method"])
def test_nothing_else_is_rebuilt(crafted: Runs) -> None:
    with pytest.raises(pickle.UnpicklingError):
        loads(dumps((1, "stat", (crafted,))))


def test_a_frame_longer_than_its_limit_is_refused_unread() -> None:
    async def main() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", MAX_HELLO + 1))
        with pytest.raises(ValueError, match="at most"):
            await read_frame(reader, MAX_HELLO)
    asyncio.run(main())


def test_a_request_frame_longer_than_the_nodes_cap_is_refused_unread() -> None:
    async def main() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(struct.pack(">I", MAX_REQUEST + 1))
        with pytest.raises(ValueError, match="at most"):
            await read_frame(reader, MAX_REQUEST)
    asyncio.run(main())
    assert MAX_REQUEST <= 64 << 20  # one node actor holds every session of its node


@pytest.mark.parametrize("invalid", [
    SpawnRequest.model_construct(job="j", argv=["true"], cwd="/", env={}, deadline_ms=-1),
    SpawnRequest.model_construct(job="j", argv=[], cwd="/", env={}),
    PathRef.model_construct(base="/w", path=7, confine=True),
    ChangeSet.model_construct(base="/w", ops=[SpawnRequest.model_construct(job="x")]),
], ids=["deadline_ms=-1", "no argv", "a path that is a number", "a nested invalid model"])
def test_a_model_that_does_not_validate_is_refused(invalid: Any) -> None:
    """Pickle rebuilds a model without its validators: the codec runs them again."""
    with pytest.raises(pickle.UnpicklingError, match="not a valid seam value"):
        loads(dumps((1, "start", (invalid,))))


def test_a_crafted_answer_is_refused_by_the_caller(tmp_path: Any) -> None:
    """A node actor that is not ours answers a Ray-path call with a pickle that would run code
    in the driver: it is refused as not a toolseam answer, and nothing runs."""
    marker = tmp_path / "ran"
    crafted = pickle.dumps(("ok", Runs(os.system, f"touch {marker}")))
    with pytest.raises(pickle.UnpicklingError):  # RayTransport: "not a toolseam answer"
        loads(crafted)
    assert not marker.exists()
    assert loads(dumps(("ok", TextContent(text="x", size=1)))) == (
        "ok", TextContent(text="x", size=1))


PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_calls_trace_context_crosses_validated() -> None:
    """A call's W3C trace context (decision 390) is a seam model: it crosses as one, and only
    the W3C shape crosses — the codec's allowed classes are the same as before."""
    came = TraceContext(traceparent=PARENT, tracestate="vendor=a1")
    request = ("s", "k", "stat", (), {})
    assert loads(dumps((request, came))) == (request, came)  # RayTransport's payload
    assert trace_context(loads(dumps((request, came)))[1]) == came
    assert trace_context(None) is None
    with pytest.raises(TypeError, match="not a TraceContext"):
        trace_context({"traceparent": PARENT})


@pytest.mark.parametrize("invalid", [
    TraceContext.model_construct(traceparent="00-zz-00f067aa0ba902b7-01", tracestate=None),
    TraceContext.model_construct(traceparent=PARENT + "-and-more", tracestate=None),
    TraceContext.model_construct(traceparent=PARENT, tracestate="k=" + "v" * 600),
    TraceContext.model_construct(traceparent=PARENT, tracestate="k=\n"),
], ids=["not hex", "longer than one", "a state past 512", "a control character"])
def test_a_trace_context_that_is_not_w3c_is_refused(invalid: TraceContext) -> None:
    with pytest.raises(pickle.UnpicklingError, match="not a valid seam value"):
        loads(dumps((1, "stat", (), invalid)))
