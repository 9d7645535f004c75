"""The core's side of a fleet: what a shared store feeds back, one rule at a time."""

from __future__ import annotations

import pytest
from helpers import make, refs

from celery_fair.core import BlockReason
from celery_fair.errors import UnknownJob

FG = ("clone", 8, None, "git", 10)
LIMITED = ("repack", 4, 2, "git", 20)


def test_a_reverted_admission_goes_back_to_its_place_and_is_refunded():
    s, _ = make(2, [FG])
    s.submit("a1", "clone", "x1", "a")
    s.submit("a2", "clone", "x2", "a")
    s.submit("b1", "clone", "x3", "b")
    assert refs(s.schedule()) == ["a1", "b1"]
    # The store refused a1: it is pending again, first in line, and a pays nothing for it.
    s.revert("a1")
    assert s.accumulated_cost("a") == 0
    assert s.running == 1
    assert refs(s.schedule()) == ["a1"]


def test_a_key_whose_cost_went_down_while_its_lane_was_empty_keeps_its_turn_there():
    s, _ = make(2, [("low", 1, None, "", 1), ("high", 2, None, "", 1)])
    s.submit("l1", "low", None, "a")
    assert refs(s.schedule()) == ["l1"]
    s.submit("h1", "high", None, "a")  # queued at a's cost of 1
    assert refs(s.schedule()) == ["h1"]  # a has used 2; a's "high" line is empty
    # a's cost goes down twice (a refund, then the fleet's figure) while that line is empty,
    s.revert("l1")
    s.set_accumulated("a", 0)
    # then a's next "high" job, tied with b's at 0, goes first by submission order.
    s.submit("h2", "high", None, "a")
    s.submit("h3", "high", None, "b")
    assert refs(s.schedule()) == ["h2"]


def test_reverting_a_job_that_holds_a_conflict_frees_it_for_its_waiters():
    s, _ = make(3, [FG])
    s.submit("first", "clone", "linux", "a")
    s.submit("waiter", "clone", "linux", "b")
    assert refs(s.schedule()) == ["first"]  # waiter parks behind the conflict
    s.revert("first")
    s.cancel("first")
    assert refs(s.schedule()) == ["waiter"]


def test_only_running_jobs_can_be_reverted():
    s, _ = make(1, [FG])
    s.submit("p", "clone", "x")
    with pytest.raises(UnknownJob):
        s.revert("p")


def test_jobs_running_elsewhere_count_against_tier_and_type_caps():
    s, _ = make(8, [FG, LIMITED])  # repack: tier cap 4, type cap 2
    for i in range(4):
        s.submit(f"r{i}", "repack", f"repo{i}")
    s.set_running_elsewhere({}, {"repack": 1})
    assert refs(s.schedule()) == ["r0"]  # 2 - 1 elsewhere
    s.set_running_elsewhere({4: 4}, {})
    assert s.schedule() == []  # the tier is full across the fleet
    view = s.status("r1")
    assert view is not None
    assert BlockReason.TIER_CAP in view.blocked_by
    s.set_running_elsewhere({}, {})
    assert refs(s.schedule()) == ["r1"]


def test_a_conflict_held_elsewhere_parks_its_waiters_until_it_is_released():
    s, _ = make(4, [FG])
    s.hold_elsewhere("git", "linux")
    s.submit("w1", "clone", "linux", "a")
    s.submit("other", "clone", "git", "a")
    assert refs(s.schedule()) == ["other"]
    assert s.held_elsewhere() == [("git", "linux")]
    s.release_elsewhere("git", "linux")
    assert refs(s.schedule()) == ["w1"]


def test_a_conflict_held_here_and_elsewhere_stays_held_until_both_let_go():
    s, _ = make(4, [FG])
    s.submit("mine", "clone", "linux", "a")
    assert refs(s.schedule()) == ["mine"]
    s.hold_elsewhere("git", "linux")
    s.submit("waiter", "clone", "linux", "b")
    s.complete("mine", 1.0)
    assert s.schedule() == []
    s.release_elsewhere("git", "linux")
    assert refs(s.schedule()) == ["waiter"]


def test_conflicts_held_elsewhere_that_nobody_here_waits_for_are_forgotten():
    s, _ = make(4, [FG])
    s.hold_elsewhere("git", "linux")
    assert s.held_elsewhere() == []
    s.submit("j", "clone", "linux")
    assert refs(s.schedule()) == ["j"]


def test_a_fleet_cost_that_is_lower_moves_the_key_ahead_again():
    s, _ = make(1, [FG])
    s.submit("a1", "clone", "x1", "a", cost=5)
    s.submit("b1", "clone", "x2", "b", cost=5)
    s.submit("a2", "clone", "x3", "a", cost=5)
    assert refs(s.schedule()) == ["a1"]
    s.complete("a1", 1.0)
    # Locally a has 5 and b 0, but the fleet's record (a reset, say) puts a at 0 and b at 2.
    s.set_accumulated("b", 2.0)
    s.set_accumulated("a", 0.0)
    assert refs(s.schedule()) == ["a2"]


def test_a_lower_cost_also_reorders_the_waiters_of_a_conflict():
    s, _ = make(2, [FG])
    s.submit("holder", "clone", "linux", "z", cost=1)
    assert refs(s.schedule()) == ["holder"]
    s.submit("a", "clone", "linux", "a", cost=1)
    s.submit("b", "clone", "linux", "b", cost=1)
    s.set_accumulated("a", 9.0)
    s.set_accumulated("b", 4.0)
    s.complete("holder", 1.0)  # the freed conflict's first waiter: b
    s.set_accumulated("a", 1.0)  # a is lowered while parked: a comes first now
    assert refs(s.schedule()) == ["a"]


def test_the_fleet_estimate_is_what_the_next_admission_charges():
    s, _ = make(1, [FG])
    s.set_estimate("clone", "linux", 3.5)
    s.submit("j", "clone", "linux", "k")
    (admission,) = s.schedule()
    assert admission.estimate == 3.5
    assert s.accumulated_cost("k") == 3.5


def test_a_newcomer_outranks_an_admission_only_by_at_least_its_own_cost():
    s, _ = make(4, [("clone", 8, None, "git", 1), ("bg", 2, None, "", 1)])
    s.submit("a1", "clone", "x1", "a", cost=1)
    s.submit("b1", "clone", "x2", "b", cost=3)
    [a1, b1] = s.schedule()  # a has used 1, b 3: both from 0
    s.submit("c1", "clone", "x3", "c", cost=2)  # c at 0, ahead of both, by less than 2
    s.submit("d1", "bg", "x4", "d", cost=0.5)  # a lower tier: never
    assert not s.outranks("c1", [b1])
    assert not s.outranks("d1", [a1])
    s.set_accumulated("b", 5.0)  # b had used 2 before b1: c goes first, charged 2 or not
    assert s.outranks("c1", [b1])
    assert not s.outranks("c1", [a1])  # a had used 0
    s.set_accumulated("c", 0.5)  # c charged 2 would pass b's 2: ahead by less than its job
    assert not s.outranks("c1", [b1])
    assert not s.outranks("nobody", [a1])  # pending jobs only
    assert not s.outranks("a1", [b1])


def test_a_waiter_on_a_conflict_outranks_an_admission_only_as_its_first_once_it_is_freed():
    s, _ = make(4, [("clone", 8, None, "git", 1)])
    s.submit("holder", "clone", "linux", "z", cost=1)
    s.submit("b1", "clone", "x2", "b", cost=3)
    [_, b1] = s.schedule()
    s.submit("c-linux", "clone", "linux", "c", cost=1)  # both parked behind holder
    s.submit("d-linux", "clone", "linux", "d", cost=1)
    s.set_accumulated("b", 5.0)  # b had used 2 before b1: c or d, charged 1, goes first
    assert not s.outranks("c-linux", [b1])  # linux is held, and not by b1
    s.complete("holder", 1)
    assert s.outranks("c-linux", [b1])  # linux's first waiter
    assert not s.outranks("d-linux", [b1])  # behind c-linux on linux: it cannot go next


def test_a_newcomer_outranks_admissions_only_if_they_hold_at_least_the_tolerance():
    s, _ = make(4, [("clone", 8, None, "git", 1), ("bg", 2, None, "", 1)])
    s.submit("b1", "clone", "x1", "b", cost=1)
    s.submit("b2", "clone", "x2", "b", cost=1)
    s.submit("g1", "bg", "x3", "g", cost=1)
    [b1, b2, g1] = s.schedule()
    s.set_accumulated("b", 10.0)  # far ahead: a newcomer goes before each of b's jobs
    s.submit("c1", "clone", "x4", "c", cost=1)
    # c1 goes before b1, b2 and the lower tier's g1: 3 of admitted work in all.
    assert s.outranks("c1", [b1, b2, g1], tolerance=3.0)
    assert not s.outranks("c1", [b1, b2, g1], tolerance=3.5)  # not worth a give-back
    assert not s.outranks("c1", [b1, g1], tolerance=2.5)
    assert s.outranks("c1", [b1], tolerance=0.0)


def test_a_newcomer_of_a_higher_tier_outranks_an_admission_whatever_its_cost():
    s, _ = make(2, [("clone", 8, None, "git", 1), ("bg", 2, None, "", 1)])
    s.submit("g1", "bg", "x1", "g")
    [low] = s.schedule()
    s.submit("h1", "clone", "x2", "h", cost=100)
    assert s.outranks("h1", [low])


def test_a_newcomer_behind_an_earlier_job_of_its_key_outranks_nothing():
    s, _ = make(1, [("clone", 8, None, "git", 1)])
    s.submit("b1", "clone", "x1", "b", cost=3)
    [b1] = s.schedule()
    s.set_accumulated("b", 10.0)  # b is far ahead: a newcomer of another key would go first
    s.submit("c1", "clone", "x2", "c", cost=1)
    assert s.outranks("c1", [b1])
    s.submit("c2", "clone", "x3", "c", cost=1)  # behind c1: it moves nothing c1 does not
    assert not s.outranks("c2", [b1])
    # Unless c1 cannot start (another worker took its conflict since): then c2 is c's next.
    s.hold_elsewhere("git", "x2")
    assert s.outranks("c2", [b1])


def test_a_newcomer_waiting_for_a_conflict_outranks_only_the_admission_that_holds_it():
    s, _ = make(3, [("clone", 8, None, "git", 1)])
    s.submit("b1", "clone", "linux", "b", cost=3)
    s.submit("r1", "clone", "gcc", "r", cost=3)
    [b1, r1] = s.schedule()
    s.set_accumulated("b", 10.0)
    s.set_accumulated("r", 10.0)
    s.submit("c1", "clone", "linux", "c", cost=1)  # parked at once: b1 holds linux
    assert not s.outranks("c1", [r1])
    assert s.outranks("c1", [b1, r1])  # giving b1 back would let c1 go first
    s.hold_elsewhere("git", "emacs")
    s.submit("d1", "clone", "emacs", "d", cost=1)  # waits for another worker's job
    assert not s.outranks("d1", [b1, r1])
