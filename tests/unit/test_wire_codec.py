"""The agent wire's codec (toolseam_agent/wire.py: loads, dumps) is json's, called directly.

Both ends decode what the other wrote, and the host decodes what a hostile agent writes: the
direct scan must agree with ``json.loads`` on every text — the same value, or a ValueError —
and ``dumps`` must write what ``json.loads`` reads back as the same value.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolseam_agent import wire

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30)


@given(_JSON)
def test_dumps_round_trips_through_json(value: Any) -> None:
    text = wire.dumps(value)
    assert "\n" not in text  # one message, one line
    assert json.loads(text) == value
    assert wire.loads(text) == value


def _outcome(parse: Any, text: str) -> tuple[str, Any]:
    try:
        value = parse(text)
    except ValueError:
        return ("error", None)
    except RecursionError:
        return ("deep", None)
    return ("value", json.dumps(value, sort_keys=True, allow_nan=True))


@given(st.text(max_size=60) | _JSON.map(json.dumps).flatmap(
    lambda text: st.sampled_from([text, f" {text}", f"{text} ", f"{text}x", text[:-1] or text])))
def test_loads_agrees_with_json_on_any_text(text: str) -> None:
    assert _outcome(wire.loads, text) == _outcome(json.loads, text)


@pytest.mark.parametrize("text", ["NaN", "[Infinity, -Infinity]", '{"a": NaN}'])
def test_the_constants_json_takes(text: str) -> None:
    ours, theirs = wire.loads(text), json.loads(text)
    assert json.dumps(ours) == json.dumps(theirs)
    assert any(isinstance(v, float) and not math.isfinite(v)
               for v in (ours if isinstance(ours, list) else
                         ours.values() if isinstance(ours, dict) else [ours]))


def test_what_json_cannot_write_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not JSON serializable"):
        wire.dumps({"a": object()})
