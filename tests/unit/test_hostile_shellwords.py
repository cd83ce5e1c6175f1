"""``split_words`` is ``shlex.split(text, comments=True)`` in linear time (issue 19: with a read
scope on, bash time grew quadratically with the length of one quoted word)."""

from __future__ import annotations

import shlex
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from toolseam.policy.shellwords import split_words

texts = st.text(alphabet=st.sampled_from(list("ab #'\"\\\n\t\r/~.é")), max_size=40)


@given(texts)
@settings(max_examples=3000, deadline=None)
def test_the_same_words_as_shlex(text: str) -> None:
    try:
        expected: list[str] | type[ValueError] = shlex.split(text, comments=True)
    except ValueError:
        expected = ValueError
    try:
        got: list[str] | type[ValueError] = split_words(text)
    except ValueError:
        got = ValueError
    assert got == expected, repr(text)


def test_linear_in_the_length_of_one_word() -> None:
    """The growth, not a time: 8 times the text takes about 8 times as long (shlex: 64 times).
    Each size's best of three, so a busy machine does not decide it."""
    timings = []
    for size in (60_000, 480_000):
        text = "echo '" + "a b " * (size // 4) + "' \"" + "c\\\"d " * (size // 5) + '"'
        best = float("inf")
        for _ in range(3):  # CPU time, best of three: a loaded machine does not decide it
            started = time.process_time()
            split_words(text)
            best = min(best, time.process_time() - started)
        timings.append(best)
    assert timings[1] < 8 * max(timings[0], 0.005) * 2.5  # 8 times the text, not 64 times the time
