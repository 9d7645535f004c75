"""A fairness key's rate of ends (``Queued.rate``): the rule that both stores keep."""

from __future__ import annotations

import pytest

from celery_fair.store.base import RATE_WINDOW, rate_after, service_rate


def feed(ends):
    record = None
    for at, n in ends:
        record = rate_after(record, n, at)
    return record


def test_ends_a_second_apart_give_their_rate_and_a_pause_lowers_it():
    record = feed([(100.0, 1), (101.0, 1), (102.0, 1), (103.0, 1)])
    assert record == (4.0, 100.0, 103.0)
    assert service_rate(record, 103.0) == 1.0  # 3 ends after the first, in 3 s
    assert service_rate(record, 106.0) == 0.5  # nothing for 3 s: half as fast
    assert service_rate(record, 103.0 + RATE_WINDOW + 1) == 0.0  # a window without ends


def test_not_known_from_one_end_nor_within_a_second_of_the_first():
    assert service_rate(None, 5.0) == 0.0
    assert service_rate(feed([(10.0, 1)]), 20.0) == 0.0
    assert service_rate(feed([(10.0, 3)]), 10.5) == 0.0
    assert service_rate(feed([(10.0, 3)]), 12.0) == 1.0  # 3 at once: 2 after the first


def test_past_a_window_it_keeps_the_last_half_windows_share():
    ends = [(float(t), 2) for t in range(100)]  # 2 a second for 100 s
    record = feed(ends)
    _n, since, last = record
    assert last == 99.0
    assert since >= last - RATE_WINDOW
    assert service_rate(record, 99.0) == pytest.approx(2.0, rel=0.1)


def test_a_gap_longer_than_the_window_starts_it_over():
    record = feed([(0.0, 5), (1.0, 5), (1.0 + RATE_WINDOW + 0.5, 1)])
    assert record == (1.0, 1.0 + RATE_WINDOW + 0.5, 1.0 + RATE_WINDOW + 0.5)
