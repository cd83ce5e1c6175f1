"""The direct path's codec (toolseam/ray/direct.py, decision 312): what a peer sends after
its hello is rebuilt as builtin values and the seam's wire models only — never a callable or
another class, whatever the pickle asks for."""

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

from toolseam.ray.direct import MAX_HELLO, dumps, loads, read_frame
from toolseam.seam.errors import HostError
from toolseam.seam.models import ChangeSet, JobStatus, PathRef, SpawnRequest, TextContent

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
