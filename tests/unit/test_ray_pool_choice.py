"""Which node a ``RayPool`` claim goes to (issue 39, item 3): the node with the most of its
share left, so a burst spreads; at a tie, a node that had the image before the pool started
(its sandboxes and refills start without a pull). No cluster: the choice is the caller's own."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from toolseam.ray import RayPool


def pool_over(nodes: dict[str, tuple[int, bool]]) -> RayPool:
    pool = RayPool(size=sum(share for share, _ in nodes.values()))
    for node, (share, has_image) in nodes.items():
        pool._nodes[node] = {"share": share, "has_image": has_image, "where": node}
        pool._claims[node] = 0
    return pool


def claim(pool: RayPool) -> str:
    node = pool._choose()
    pool._claims[node] += 1
    return node


def test_a_tie_goes_to_the_node_that_had_the_image() -> None:
    pool = pool_over({"a-pulling": (2, False), "b-had-it": (2, True), "c-pulling": (2, False)})
    assert claim(pool) == "b-had-it"
    assert claim(pool) in ("a-pulling", "c-pulling")  # then the most left, not the image again


@given(st.lists(st.tuples(st.integers(1, 12), st.booleans()), min_size=1, max_size=6),
       st.integers(0, 80))
def test_claims_follow_the_shares_and_never_pile_on_one_node(
        nodes: list[tuple[int, bool]], claims: int) -> None:
    pool = pool_over({f"n{i}": node for i, node in enumerate(nodes)})
    taken = Counter(claim(pool) for _ in range(claims))
    left = {n: pool._nodes[n]["share"] - taken[n] for n in pool._nodes}
    # every claim went to a node with the most left at that moment: what is left stays level
    assert max(left.values()) - min(left.values()) <= max(
        max(share for share, _ in nodes) - min(share for share, _ in nodes), 1)
    if claims <= sum(share for share, _ in nodes):
        assert all(value >= 0 for value in left.values())  # no node past its share early
