"""The adaptive reserve: deep for short jobs, one job for long ones, never past its bounds."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_fair.core import ReserveDepth


def test_nothing_timed_yet_keeps_the_minimum():
    assert ReserveDepth(0.01, minimum=1, maximum=8).depth(slots=4) == 1
    assert ReserveDepth(0.01, minimum=2, maximum=8).depth(slots=4) == 2


@pytest.mark.parametrize(
    ("mean", "slots", "expected"),
    [
        (0.010, 2, 2),  # 10 ms jobs on 2 processes: 2 free up in 10 ms
        (0.005, 2, 4),
        (0.010, 8, 8),
        (0.004, 1, 3),  # 2.5 rounds up: the window is covered, not just approached
        (0.100, 2, 1),  # a tenth of a job: one ahead is the least that hides the round trip
        (0.0001, 2, 8),  # 200 wanted, capped
    ],
)
def test_the_reserve_covers_the_window_of_the_pools_work(mean, slots, expected):
    sizer = ReserveDepth(0.01, minimum=1, maximum=8)
    sizer.observe(mean)
    assert sizer.depth(slots) == expected


def test_the_depth_follows_jobs_that_get_longer_and_shorter_again():
    sizer = ReserveDepth(0.01, minimum=1, maximum=8, alpha=0.5)
    sizer.observe(0.001)
    assert sizer.depth(2) == 8
    depths = []
    for _ in range(12):
        sizer.observe(1.0)
        depths.append(sizer.depth(2))
    assert depths[0] < 8  # one long job halves the mean's distance at alpha 0.5
    assert depths[-1] == 1
    assert depths == sorted(depths, reverse=True)  # never grows while jobs get longer
    for _ in range(40):
        sizer.observe(0.001)
    assert sizer.depth(2) == 8


def test_a_zero_mean_asks_for_the_maximum_and_junk_is_ignored():
    sizer = ReserveDepth(0.01, minimum=1, maximum=5)
    sizer.observe(0.0)
    assert sizer.depth(2) == 5
    for junk in (float("nan"), -1.0, float("inf")):
        sizer.observe(junk)
    assert sizer.mean == 0.0


def test_no_processes_means_the_minimum():
    sizer = ReserveDepth(0.01)
    sizer.observe(0.001)
    assert sizer.depth(0) == sizer.minimum


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window": 0},
        {"window": float("nan")},
        {"window": 0.01, "minimum": 3, "maximum": 2},
        {"window": 0.01, "minimum": -1},
        {"window": 0.01, "alpha": 0},
    ],
)
def test_bad_bounds_are_refused(kwargs):
    with pytest.raises(ValueError, match=r"window|minimum|alpha"):
        ReserveDepth(**kwargs)


@given(
    times=st.lists(st.floats(min_value=0, max_value=3600, allow_nan=False), min_size=1),
    slots=st.integers(min_value=1, max_value=256),
    window=st.floats(min_value=1e-4, max_value=10),
)
def test_the_depth_stays_within_its_bounds_and_covers_the_window(times, slots, window):
    sizer = ReserveDepth(window, minimum=1, maximum=8)
    for t in times:
        sizer.observe(t)
    depth = sizer.depth(slots)
    assert 1 <= depth <= 8
    assert sizer.mean is not None
    if depth < 8 and sizer.mean > 0:
        # below the cap, the reserve lasts at least the window at the mean's pace
        assert depth * sizer.mean / slots >= window * (1 - 1e-6)
