"""The sequencer's pause after a busy round (fluxpg.queues.sequencer.busy_pause): pure arithmetic,
checked for its bounds and its shape."""
from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fluxpg.queues import sequencer
from fluxpg.queues.sequencer import BUSY_FULL, BUSY_PAUSE_MAX, POLL_MIN, busy_pause

moved = st.integers(min_value=1, max_value=100_000)
seconds = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(moved, seconds)
def test_the_pause_stays_between_the_bounds(n, s):
    assert POLL_MIN <= busy_pause(n, s) <= BUSY_PAUSE_MAX


@given(moved, moved, seconds)
def test_fuller_rounds_never_pause_less(a, b, s):
    lo, hi = sorted((a, b))
    assert busy_pause(lo, s) <= busy_pause(hi, s)


@given(moved, seconds, seconds)
def test_longer_rounds_never_pause_less(n, a, b):
    lo, hi = sorted((a, b))
    assert busy_pause(n, lo) <= busy_pause(n, hi)


def test_the_ratio_to_the_round_by_how_full_it_was():
    low, high = sequencer.BUSY_RATIO
    r = 0.001   # a round of 1 ms: the ratios show between POLL_MIN and BUSY_PAUSE_MAX
    assert busy_pause(1, r) == max(POLL_MIN, low * r)
    assert busy_pause(BUSY_FULL, r) == high * r
    assert busy_pause(4 * BUSY_FULL, r) == sequencer.BUSY_RATIO_MAX * r
    assert busy_pause(100 * BUSY_FULL, r) == sequencer.BUSY_RATIO_MAX * r
    assert busy_pause(1, 10.0) == BUSY_PAUSE_MAX
