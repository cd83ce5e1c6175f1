"""Where ``Placement`` puts a session (``toolseam/ray/placement.py``): spread goes to the node
with the fewest of this process's OPEN sessions, pack to the most. Counted over the process's
life instead (before), a driver that had run sessions on one node and closed them spread every
later session over the other nodes alone (found by ``test_sessions_spread_over_the_nodes``
run after other Ray tests in one process). No cluster: the fitting nodes are given."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolseam.ray import cluster, placement
from toolseam.ray.placement import Placement, released

NODES = ["a", "b", "c"]


@pytest.fixture(autouse=True)
def three_nodes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(cluster, "fitting_nodes",
                        lambda ray, resources: [{"NodeID": n} for n in NODES])
    monkeypatch.setattr(placement, "_placed", Counter())
    yield


def test_sessions_closed_on_a_node_leave_it_free_for_spread() -> None:
    for _ in range(5):  # five sessions on the first node, all closed
        released(Placement({}, strategy="pack").choose(None))
    chosen = [Placement({}).choose(None) for _ in range(6)]
    assert Counter(chosen) == {"a": 2, "b": 2, "c": 2}


@given(st.lists(st.tuples(st.sampled_from(["spread", "pack"]), st.booleans()), max_size=30))
def test_the_count_is_the_open_sessions(steps: list[tuple[str, bool]]) -> None:
    placement._placed.clear()
    open_here: list[str] = []
    for strategy, close_one in steps:
        node = Placement({}, strategy=strategy).choose(None)
        counts = Counter(open_here)
        least, most = min(counts[n] for n in NODES), max(counts[n] for n in NODES)
        assert counts[node] == (least if strategy == "spread" else most)
        open_here.append(node)
        if close_one and open_here:
            released(open_here.pop(0))
    assert +placement._placed == Counter(open_here)
