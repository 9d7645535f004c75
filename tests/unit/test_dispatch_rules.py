"""Each rule of dispatch, one at a time, on the real core with a simulated clock."""

from __future__ import annotations

import pytest
from helpers import drain, make, refs

from celery_fair.core import BlockReason, CancelOutcome, JobState
from celery_fair.errors import (
    ConfigurationError,
    DuplicateJob,
    SchedulerError,
    UnknownJob,
    UnknownJobType,
)

FG = ("clone", 8, None, "git", 10)
BG = ("repack", 4, 3, "git", 20)
SNAP = ("snapshot", 4, 5, "", 5)


# -- order -----------------------------------------------------------------------------


def test_higher_priority_tier_is_admitted_first_whatever_the_arrival():
    s, clock = make(1, [FG, BG])
    s.submit("bg", "repack", "a")
    clock.advance(10)
    s.submit("fg", "clone", "b", "k")
    assert refs(s.schedule()) == ["fg"]


def test_key_with_least_accumulated_cost_goes_first_within_a_tier():
    s, _ = make(1, [FG])
    s.submit("a1", "clone", "x1", "a", cost=10)
    s.submit("a2", "clone", "x2", "a", cost=10)
    s.submit("b1", "clone", "x3", "b", cost=3)
    s.submit("b2", "clone", "x4", "b", cost=3)
    s.submit("b3", "clone", "x5", "b", cost=3)
    # a1 first (tie at 0, earlier); then b leads until it passes a's 10.
    assert drain(s) == ["a1", "b1", "b2", "b3", "a2"]


def test_ties_in_cost_go_to_the_earlier_arrival_then_to_submission_order():
    s, _ = make(1, [FG])
    s.submit("late", "clone", None, "a", arrival=5)
    s.submit("early", "clone", None, "b", arrival=1)
    s.submit("early-too", "clone", None, "c", arrival=1)
    assert drain(s) == ["early", "early-too", "late"]


def test_admission_charges_the_estimate_to_the_key():
    s, _ = make(8, [FG])
    s.submit("a", "clone", "linux", "k")
    (admission,) = s.schedule()
    assert admission.estimate == 10
    assert s.accumulated_cost("k") == 10


def test_given_cost_is_charged_instead_of_the_estimate():
    s, _ = make(8, [FG])
    s.submit("a", "clone", "linux", "k", cost=2.5)
    assert s.schedule()[0].estimate == 2.5
    assert s.accumulated_cost("k") == 2.5


def test_tokens_increase_strictly_across_admissions():
    s, _ = make(8, [FG])
    for i in range(5):
        s.submit(i, "clone", str(i), "k")
    tokens = [a.token for a in s.schedule()]
    assert tokens == sorted(set(tokens))
    assert len(tokens) == 5


# -- admissibility ----------------------------------------------------------------------


def test_global_capacity_bounds_everything():
    s, _ = make(3, [FG, SNAP])
    for i in range(5):
        s.submit(f"c{i}", "clone", f"r{i}", "k")
        s.submit(f"s{i}", "snapshot", f"r{i}")
    assert len(s.schedule()) == 3
    assert s.next_admission() is None


def test_tier_cap_defaults_to_the_priority_value():
    s, _ = make(100, [("low", 2)])
    for i in range(5):
        s.submit(i, "low")
    assert len(s.schedule()) == 2


def test_tier_cap_override_replaces_the_priority_value():
    s, _ = make(100, [("low", 2)], tier_caps={2: 4})
    for i in range(6):
        s.submit(i, "low")
    assert len(s.schedule()) == 4


def test_tier_cap_none_means_no_tier_cap():
    s, _ = make(7, [("low", 2)], tier_caps={2: None})
    for i in range(9):
        s.submit(i, "low")
    assert len(s.schedule()) == 7


def test_types_of_one_priority_share_the_tier_cap():
    s, _ = make(100, [BG, SNAP])
    for i in range(4):
        s.submit(f"r{i}", "repack", f"r{i}")
        s.submit(f"s{i}", "snapshot", f"s{i}")
    assert len(s.schedule()) == 4


def test_type_cap_bounds_one_type_and_lets_others_through():
    s, _ = make(100, [("t", 8, 2), ("u", 8)])
    for i in range(4):
        s.submit(f"t{i}", "t")
    s.submit("u0", "u")
    assert sorted(refs(s.schedule())) == ["t0", "t1", "u0"]


def test_max_concurrency_zero_never_runs():
    s, _ = make(8, [("never", 8, 0)])
    s.submit("x", "never")
    assert s.schedule() == []
    assert s.status("x").blocked_by == (BlockReason.TYPE_CAP,)


def test_same_group_same_job_id_never_overlap():
    s, _ = make(8, [FG, BG])
    s.submit("clone", "clone", "linux", "k")
    s.submit("repack", "repack", "linux")
    assert refs(s.schedule()) == ["clone"]
    s.complete("clone", 3)
    assert refs(s.schedule()) == ["repack"]


def test_different_job_ids_of_one_group_run_in_parallel():
    s, _ = make(8, [FG, BG])
    s.submit("c", "clone", "linux", "k")
    s.submit("r", "repack", "git")
    assert sorted(refs(s.schedule())) == ["c", "r"]


def test_same_job_id_in_different_groups_or_no_group_run_in_parallel():
    s, _ = make(8, [FG, SNAP, ("other", 8, None, "blob")])
    s.submit("c", "clone", "linux", "k")
    s.submit("s", "snapshot", "linux")
    s.submit("o", "other", "linux", "k")
    assert sorted(refs(s.schedule())) == ["c", "o", "s"]


def test_jobs_without_job_id_never_conflict():
    s, _ = make(8, [FG])
    s.submit("a", "clone", None, "k")
    s.submit("b", "clone", None, "k")
    assert sorted(refs(s.schedule())) == ["a", "b"]


def test_blocked_conflict_does_not_block_jobs_behind_it_even_of_its_own_key():
    s, _ = make(8, [FG])
    s.submit("hold", "clone", "linux", "other")
    s.schedule()
    s.submit("k-linux", "clone", "linux", "k")
    s.submit("k-git", "clone", "git", "k")
    assert refs(s.schedule()) == ["k-git"]
    assert s.status("k-linux").blocked_by == (BlockReason.CONFLICT,)


def test_starved_says_the_last_decision_left_a_slot_that_no_pending_job_could_take():
    s, _ = make(2, [FG])
    assert not s.starved  # nothing decided yet
    # Two jobs on one repo and a free slot: the second waits for the first's conflict;
    s.submit("a", "clone", "linux", "k")
    s.submit("b", "clone", "linux", "k")
    s.schedule()
    assert s.starved
    # with a third on another repo, every slot is taken: nothing waits for a free slot;
    s.submit("c", "clone", "git", "k")
    s.schedule()
    assert not s.starved
    # and with nothing pending, a free slot is no starvation.
    s.complete("a", 1)
    s.complete("c", 1)
    assert refs(s.schedule()) == ["b"]
    assert not s.starved
    assert s.next_admission() is None
    assert not s.starved


def test_release_without_observation_frees_the_conflict_and_keeps_the_estimate():
    s, _ = make(8, [FG])
    s.submit("a", "clone", "linux", "k")
    s.submit("b", "clone", "linux", "k")
    s.schedule()
    release = s.release("a")
    assert release.elapsed is None
    assert release.estimate == 10
    assert refs(s.schedule()) == ["b"]


def test_waiters_on_a_conflict_are_released_in_dispatch_order():
    s, _ = make(8, [FG])
    s.submit("holder", "clone", "linux", "z")
    s.schedule()
    s.submit("a1", "clone", "linux", "a", cost=5)
    s.submit("b1", "clone", "linux", "b", cost=5)
    s.submit("a2", "clone", "linux", "a", cost=5)
    s.submit("free", "clone", "git", "a", cost=5)
    assert refs(s.schedule()) == ["free"]  # a is now at 5, b at 0
    order = []
    running = "holder"
    for _ in range(3):
        s.complete(running, 1)
        (admission,) = s.schedule()
        running = admission.uid
        order.append(running)
    assert order == ["b1", "a1", "a2"]


def test_a_freed_conflicts_first_waiter_changes_when_its_key_is_charged_past_another():
    # Given a repack holding linux, and two keys' clones of linux parked behind it,
    s, _ = make(8, [("clone", 8, 1, "git"), ("repack", 4, None, "git"), ("other", 8)])
    s.submit("holder", "repack", "linux", "z")
    s.schedule()
    s.submit("a-linux", "clone", "linux", "a", cost=1)
    s.submit("b-linux", "clone", "linux", "b", cost=1)
    s.submit("filler", "clone", "git", "z", cost=1)
    assert refs(s.schedule()) == ["filler"]  # both linux clones parked; clone type now full
    s.submit("b-other", "other", None, "b", cost=1)
    assert refs(s.schedule()) == ["b-other"]  # b is at 1, a at 0
    # When linux is freed, a-linux is its first waiter in the (full) clone lane: a is at 0.
    s.complete("holder", 1)
    # When a is charged 5 by another job, b-linux (b at 1) must come first instead.
    s.submit("a-other", "other", None, "a", cost=5)
    assert refs(s.schedule()) == ["a-other"]
    s.complete("filler", 1)
    assert refs(s.schedule()) == ["b-linux"]


def test_cancelling_a_freed_conflicts_first_waiter_lets_the_next_one_run():
    s, _ = make(8, [("clone", 8, 1, "git")])
    s.submit("holder", "clone", "linux", "z")
    s.schedule()
    s.submit("a", "clone", "linux", "a")
    s.submit("b", "clone", "linux", "b")
    s.schedule()
    s.complete("holder", 1)
    assert s.cancel("a") is CancelOutcome.CANCELLED
    assert refs(s.schedule()) == ["b"]


def test_a_type_whose_only_jobs_waited_on_a_conflict_runs_them_once_it_is_freed():
    # Given fetches of linux, all parked behind a clone of linux (another type),
    s, _ = make(8, [("clone", 8, None, "git"), ("fetch", 8, None, "git")])
    s.submit("clone", "clone", "linux", "z")
    s.schedule()
    for i in range(3):
        s.submit(f"f{i}", "fetch", "linux", f"k{i}")
    assert refs(s.schedule()) == []
    # when the clone ends, the fetch type has no job of its own in line, only waiters:
    # one of them runs, and each of the others after the one before it.
    s.complete("clone", 1)
    assert refs(s.schedule()) == ["f0"]
    s.complete("f0", 1)
    assert refs(s.schedule()) == ["f1"]


def test_a_job_parked_while_the_conflict_is_held_may_come_first_at_its_release():
    # Given linux and repo3 held, b's clone of linux and w's of repo3 parked behind them, b
    # having used 5 and w 3,
    s, _ = make(2, [("clone", 8, None, "git")])
    s.submit("holder1", "clone", "linux", "z1")
    s.submit("holder2", "clone", "repo3", "z2")
    assert refs(s.schedule()) == ["holder1", "holder2"]
    s.submit("b-linux", "clone", "linux", "b")
    s.submit("w-repo3", "clone", "repo3", "w")
    s.set_accumulated("b", 5.0)
    s.set_accumulated("w", 3.0)
    # linux is freed and b-linux takes it (repo3 still held),
    s.complete("holder1", 1)
    assert refs(s.schedule()) == ["b-linux"]
    # c, which has used nothing, parks a clone of linux behind b-linux, and repo3 is freed:
    s.submit("c-linux", "clone", "linux", "c")
    s.complete("holder2", 1)
    # when b-linux ends, c-linux (c at 0) goes before w-repo3 (w at 3).
    s.complete("b-linux", 1)
    assert refs(s.schedule()) == ["c-linux", "w-repo3"]


# -- cancel, capacity, errors ------------------------------------------------------------


def test_cancelled_job_is_never_admitted():
    s, _ = make(8, [FG])
    s.submit("a", "clone", "x", "k")
    s.submit("b", "clone", "y", "k")
    assert s.cancel("a") is CancelOutcome.CANCELLED
    assert refs(s.schedule()) == ["b"]
    assert s.pending == 0


def test_cancel_reports_running_and_unknown_jobs():
    s, _ = make(8, [FG])
    s.submit("a", "clone", "x", "k")
    s.schedule()
    assert s.cancel("a") is CancelOutcome.RUNNING
    assert s.cancel("nope") is CancelOutcome.UNKNOWN


def test_raising_capacity_admits_more_and_lowering_it_admits_nothing_until_jobs_finish():
    s, _ = make(1, [FG])
    for i in range(4):
        s.submit(i, "clone", str(i), "k")
    assert len(s.schedule()) == 1
    s.set_capacity(3)
    assert len(s.schedule()) == 2
    s.set_capacity(1)
    s.complete(0, 1)
    assert s.schedule() == []
    s.complete(1, 1)
    s.complete(2, 1)
    assert len(s.schedule()) == 1


def test_contract_violations_raise_named_errors():
    s, _ = make(8, [FG])
    s.submit("a", "clone", "x", "k")
    with pytest.raises(DuplicateJob):
        s.submit("a", "clone", "x", "k")
    with pytest.raises(UnknownJobType):
        s.submit("b", "nope")
    with pytest.raises(UnknownJob):
        s.complete("a", 1.0)  # pending, not running
    with pytest.raises(SchedulerError, match="cost"):
        s.submit("c", "clone", cost=-1)
    with pytest.raises(SchedulerError, match="arrival"):
        s.submit("d", "clone", arrival=float("nan"))
    s.schedule()
    with pytest.raises(SchedulerError, match="elapsed"):
        s.complete("a", float("inf"))


def test_registering_a_type_again_identically_is_fine_and_differently_is_an_error():
    s, _ = make(8, [FG])
    s.register_type(s.types["clone"])
    from celery_fair.core import JobType

    with pytest.raises(ConfigurationError, match="declared twice"):
        s.register_type(JobType("clone", priority=4))


# -- inspection ----------------------------------------------------------------------------


def test_snapshot_gives_each_pending_job_its_place_overall_and_within_its_key():
    s, _ = make(1, [FG, BG])
    s.submit("run", "clone", "r0", "a")
    s.schedule()  # a is at 10
    s.submit("a1", "clone", "r1", "a")
    s.submit("b1", "clone", "r2", "b")
    s.submit("bg", "repack", "r3")
    s.submit("b2", "clone", "r4", "b")
    snap = s.snapshot()
    pending = [(v.uid, v.place, v.place_in_key) for v in snap.jobs if v.state is JobState.PENDING]
    assert pending == [("b1", 1, 1), ("b2", 2, 2), ("a1", 3, 1), ("bg", 4, 1)]
    assert snap.running_by_tier == {8: 1, 4: 0}
    assert snap.pending_by_key == {"a": 1, "b": 2, "": 1}
    assert s.status("a1").place == 3
    assert all(BlockReason.CAPACITY in v.blocked_by for v in snap.jobs if v.place)


def test_status_of_a_running_job_has_no_place():
    s, _ = make(8, [FG])
    s.submit("a", "clone", "x", "k")
    s.schedule()
    view = s.status("a")
    assert view.state is JobState.RUNNING
    assert view.place is None
    assert s.status("gone") is None


# -- counts for metrics ------------------------------------------------------------------


def test_blocked_counts_name_each_pending_job_once_by_what_would_still_hold_it():
    # repack: type cap 3, conflict group git; snapshot: tier 4 (shared with repack), cap 5.
    s, _ = make(4, [FG, BG, SNAP], tier_caps={4: 3})
    for i in range(3):
        s.submit(f"r{i}", "repack", f"repo{i}", "a")
    s.submit("fg-linux", "clone", "linux", "b")
    assert refs(s.schedule()) == ["fg-linux", "r0", "r1", "r2"]  # every slot busy now
    s.submit("c-linux", "clone", "linux", "c")  # its conflict is held, and no slot is free
    s.submit("r3", "repack", "repo3", "c")  # type cap 3 reached, tier cap 3 too
    s.submit("snap", "snapshot", None, "c")  # its tier's cap of 3 is reached
    s.submit("fg", "clone", "other", "c")  # only every slot being busy
    counts = s.blocked_counts()
    assert counts == {
        "paused": 0,
        "rate_limit": 0,
        "conflict": 1,
        "key_cap": 0,
        "tenant_cap": 0,
        "type_cap": 1,
        "tier_cap": 1,
        "capacity": 1,
        "admissible": 0,
    }
    # The same answer as the one-job-at-a-time rule of snapshots, reason by reason.
    jobs = [v for v in s.snapshot().jobs if v.place is not None]
    assert sum(counts.values()) == len(jobs) == s.pending
    s.complete("fg-linux", 1.0)  # a slot frees: fg (and c-linux) may go now
    assert s.blocked_counts()["admissible"] == 2


def test_by_type_counts_pending_and_running_per_type_with_its_tier():
    s, _ = make(2, [FG, BG])
    s.submit("a", "clone", "x", "k")
    s.submit("b", "clone", "y", "k")
    s.submit("c", "repack", "z", "k")
    s.schedule()
    assert sorted(s.by_type()) == [("clone", 8, 0, 2), ("repack", 4, 1, 0)]
