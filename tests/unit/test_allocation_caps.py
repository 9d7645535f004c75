"""Allocation caps: each key's slot allocation as its soft cap (SchedulerConfig.allocation_caps).

Hand-computed cases; tests/property/test_against_reference.py checks random traces against
the oracle, and the state machine checks the shares stay right through every operation.
"""

from __future__ import annotations

import pytest

from celery_fair.core import (
    JobType,
    KeyPolicies,
    Scheduler,
    SchedulerConfig,
    SimClock,
)
from celery_fair.errors import ConfigurationError


def scheduler(capacity=4, caps=True, keys=None):
    config = SchedulerConfig(
        capacity,
        keys=KeyPolicies.from_mapping(keys or {}),
        allocation_caps=caps,
    )
    return Scheduler(config, SimClock(), [JobType("build", priority=8), JobType("lint", 8)])


def backlog(s, key, n, cost, type="build"):
    for i in range(n):
        s.submit(f"{key}{i}", type, None, key, cost=cost)


@pytest.mark.parametrize(
    ("caps", "started"),
    [
        # By cost alone, a's first job (cost 10) puts a behind b's cheap ones for three slots.
        (False, ["a0", "b0", "b1", "b2"]),
        # Allocated 2 slots each, b at its 2 yields the last slot to a, below its 2.
        (True, ["a0", "b0", "b1", "a1"]),
    ],
)
def test_a_key_at_its_allocation_yields_to_a_key_below_its_own(caps, started):
    s = scheduler(caps=caps)
    backlog(s, "a", 4, cost=10)
    backlog(s, "b", 4, cost=1)
    assert [a.uid for a in s.schedule()] == started
    assert s.allocation().slots == {"a": 2, "b": 2}


def test_weights_set_the_allocation_that_caps():
    s = scheduler(keys={"a": {"weight": 3}})
    backlog(s, "a", 4, cost=30)
    backlog(s, "b", 4, cost=1)
    # a: 3 of 4 slots; b: 1. b's cheap jobs wait once b runs its one.
    assert [a.uid for a in s.schedule()] == ["a0", "b0", "a1", "a2"]


def test_a_key_with_less_work_than_its_share_leaves_the_rest_to_others():
    s = scheduler()
    backlog(s, "a", 1, cost=10)
    backlog(s, "b", 6, cost=1)
    assert s.allocation().slots == {"a": 1, "b": 3}
    assert [a.uid for a in s.schedule()] == ["a0", "b0", "b1", "b2"]


def test_no_slot_idles_for_a_key_whose_jobs_cannot_run():
    s = scheduler()
    s.pause_type("lint")
    backlog(s, "a", 4, cost=1, type="lint")  # allocated 2, but none can run
    backlog(s, "b", 4, cost=10)
    assert [a.uid for a in s.schedule()] == ["b0", "b1", "b2", "b3"]


def test_the_allocation_follows_the_work_as_it_comes_and_goes():
    s = scheduler(capacity=2)
    backlog(s, "b", 6, cost=1)
    assert [a.uid for a in s.schedule()] == ["b0", "b1"]  # b alone: both slots
    backlog(s, "a", 3, cost=10)
    assert s.allocation().slots == {"a": 1, "b": 1}
    s.complete("b0", 1.0)
    # a is below its 1, b at its 1 (b1 runs): a first, though its cost is higher.
    assert [a.uid for a in s.schedule()] == ["a0"]
    s.cancel("a1")
    s.cancel("a2")
    s.complete("a0", 10.0)  # a has no work left: b's allocation is both slots again
    assert s.allocation().slots == {"b": 2}
    assert [a.uid for a in s.schedule()] == ["b2"]


def test_a_paused_key_gives_up_its_allocation_and_gets_it_back_on_resume():
    s = scheduler(capacity=2)
    backlog(s, "a", 3, cost=10)
    backlog(s, "b", 3, cost=1)
    s.pause_key("a")
    assert s.allocation().slots == {"a": 0, "b": 2}
    assert [a.uid for a in s.schedule()] == ["b0", "b1"]
    s.resume_key("a")
    s.complete("b0", 1.0)
    assert [a.uid for a in s.schedule()] == ["a0"]


def test_a_key_below_its_minimum_still_goes_first():
    s = scheduler(keys={"b": {"min_slots": 1}})
    backlog(s, "a", 4, cost=1)
    backlog(s, "b", 4, cost=100)
    s.submit("b-first", "build", None, "b", cost=100, arrival=-1.0)
    got = [a.uid for a in s.schedule()]
    assert got[0] == "b-first"  # rank 0: below its minimum
    assert sorted(got) == ["a0", "a1", "b-first", "b0"]


def test_allocation_caps_must_be_a_bool():
    with pytest.raises(ConfigurationError, match="allocation_caps must be True or False"):
        SchedulerConfig(1, allocation_caps=1)
