"""The slot-allocation view: seed 001's two worked examples, exactly, and its rules."""

from __future__ import annotations

from celery_fair.core.allocation import KeyDemand, allocate


def test_seed_001_first_example_minimums_then_weights_then_caps():
    # 16 slots; A weight 3, cap 12, 50,000 pending; B weight 1, cap 6, 200 pending, min 2.
    # Minimums: B 2, 14 left. Weights: A 10.5 -> 10, B 3.5 -> 4. Caps: A 10, B 6. Total 16.
    a = allocate(16, {"A": KeyDemand(3, 0, 12, 50_000), "B": KeyDemand(1, 2, 6, 200)})
    assert a.slots == {"A": 10, "B": 6}
    assert a.idle == 0


def test_seed_001_second_example_excess_goes_to_who_can_use_it_up_to_its_cap():
    # B has only 3 pending: it uses 3, the excess goes to A, capped at 12: 1 slot idles.
    a = allocate(16, {"A": KeyDemand(3, 0, 12, 50_000), "B": KeyDemand(1, 2, 6, 3)})
    assert a.slots == {"A": 12, "B": 3}
    assert a.idle == 1


def test_weights_share_what_is_left_and_no_slot_idles_while_someone_can_use_it():
    a = allocate(10, {"x": KeyDemand(1, 0, None, 100), "y": KeyDemand(4, 0, None, 100)})
    assert a.slots == {"x": 2, "y": 8}
    a = allocate(10, {"x": KeyDemand(1, 0, None, 100), "y": KeyDemand(4, 0, None, 1)})
    assert a == ({"x": 9, "y": 1}, 0)


def test_a_minimum_is_limited_by_demand_and_capacity():
    a = allocate(3, {"x": KeyDemand(1, 5, None, 2), "y": KeyDemand(1, 5, None, 9)})
    assert a.slots == {"x": 2, "y": 1}  # x can use only 2; y gets the 1 left
    assert a.idle == 0


def test_an_empty_or_paused_key_releases_its_allocation():
    # a paused key has nothing it may run: its demand is 0
    a = allocate(4, {"x": KeyDemand(3, 2, None, 0), "y": KeyDemand(1, 0, None, 10)})
    assert a == ({"x": 0, "y": 4}, 0)
