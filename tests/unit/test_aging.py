"""Priority aging in the core: hand-computed cases for each rule of ``types.Aging``."""

from __future__ import annotations

import pytest

from celery_fair.core import (
    Aging,
    BlockReason,
    JobState,
    JobType,
    KeyPolicies,
    Scheduler,
    SchedulerConfig,
    SimClock,
)
from celery_fair.errors import ConfigurationError


def make(capacity=1, aging=None, keys=None, tier_caps=None, types=()):
    clock = SimClock()
    config = SchedulerConfig(
        capacity,
        tier_caps=tier_caps or {},
        keys=KeyPolicies.from_mapping(keys or {}),
        aging=aging,
    )
    return Scheduler(config, clock, types), clock


def refs(admissions):
    return [a.uid for a in admissions]


def test_effective_priority_rises_one_level_per_interval_after_grace_up_to_the_ceiling():
    a = Aging(interval=10, grace=30, max_effective_priority=5)
    assert [a.effective(1, w) for w in (0, 30, 39.9, 40, 49.9, 50, 70, 10_000)] == [
        1,
        1,
        1,
        2,
        2,
        3,
        5,
        5,
    ]
    assert a.effective(7, 1e9) == 7  # at or above the ceiling: it does not rise
    assert not a.ages(5)
    assert a.ages(4)
    assert Aging(interval=1).effective(1, 100) == 101  # no ceiling


def test_urgent_only_once_risen_so_work_born_at_the_threshold_keeps_its_fairness():
    a = Aging(interval=1, max_effective_priority=9, urgent_threshold=8)
    assert a.is_urgent(1, 8)
    assert a.is_urgent(1, 9)
    assert not a.is_urgent(1, 7)
    assert not a.is_urgent(9, 9)  # born there, not aged there


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"grace": 1}, "interval is required"),
        ({"interval": 0}, "interval must be a positive number"),
        ({"interval": 1, "grace": -1}, "grace must be a number >= 0"),
        ({"interval": 1, "ceiling": 0}, "max_effective_priority must be a positive int"),
        ({"interval": 1, "urgent": 2.5}, "urgent_threshold must be a positive int"),
        ({"interval": 1, "speed": 2}, "unknown option"),
    ],
)
def test_bad_aging_options_are_refused_by_name(spec, message):
    with pytest.raises(ConfigurationError, match=message):
        Aging.from_mapping(spec)


def test_a_background_job_rises_past_a_stream_of_foreground_work():
    # One slot; a foreground job always waiting. The background job reaches the foreground's
    # priority after 40 s; then its key, which has used nothing, goes first.
    s, clock = make(
        aging=Aging(interval=10, grace=0, max_effective_priority=5),
        types=[JobType("fg", 5, max_concurrency=None), JobType("bg", 1)],
        tier_caps={1: None, 5: None},
    )
    s.submit("bg", "bg", fairness_key="batch")
    started = {}
    for t in range(60):
        clock.set(float(t))
        for a in list(started):
            if started[a] == t - 1 and a != "bg":
                s.complete(a, 1.0)
                started[a] = -1
        s.submit(f"fg{t}", "fg", fairness_key="web")
        for a in s.schedule():
            started[a.uid] = t
            if a.uid == "bg":
                assert (a.priority, a.effective_priority, a.urgent) == (1, 5, False)
        if "bg" in started:
            break
    assert started["bg"] == 40


def test_an_urgent_job_passes_its_keys_cap_but_not_its_types():
    s, clock = make(
        capacity=3,
        aging=Aging(interval=1, max_effective_priority=3, urgent_threshold=3),
        keys={"capped": {"max_concurrency": 0}},
        types=[JobType("t", 1), JobType("u", 1, max_concurrency=0)],
        tier_caps={1: None},
    )
    s.submit("t1", "t", fairness_key="capped")
    s.submit("u1", "u", fairness_key="free")
    assert s.schedule() == []
    assert s.status("t1").blocked_by == (BlockReason.KEY_CAP,)
    assert s.next_rise() == 1.0
    clock.set(1.0)
    assert s.schedule() == []  # level 2: not yet urgent
    clock.set(2.0)
    view = s.status("t1")
    assert (view.effective_priority, view.urgent, view.blocked_by) == (3, True, ())
    assert refs(s.schedule()) == ["t1"]
    assert s.status("u1").blocked_by == (BlockReason.TYPE_CAP,)  # urgent or not


@pytest.mark.parametrize("cap", ["tier", "type"])
def test_an_urgent_job_counts_only_its_own_workers_jobs_against_shared_caps(cap):
    # Other workers fill the cap: a job that is not urgent waits; an urgent one is proposed,
    # for the store to weigh (it holds the next free slot for it); a share of the cap set
    # while the store is away binds it like any job.
    s, clock = make(
        capacity=3,
        aging=Aging(interval=1, max_effective_priority=3, urgent_threshold=3),
        types=[JobType("t", 1, max_concurrency=2)],
        tier_caps={1: 2},
    )
    full = {1: 2} if cap == "tier" else {}
    types = {"t": 2} if cap == "type" else {}
    reason = BlockReason.TIER_CAP if cap == "tier" else BlockReason.TYPE_CAP
    s.set_running_elsewhere(full, types)
    s.submit("old", "t")
    clock.set(1.0)
    s.submit("young", "t")
    assert s.schedule() == []
    assert s.status("old").blocked_by == (reason,)
    clock.set(2.0)
    assert s.status("old").urgent
    assert s.status("old").blocked_by == ()
    assert s.status("young").blocked_by == (reason,)  # not urgent yet
    s.set_running_elsewhere(full, types, urgent_passes=False)
    assert s.status("old").blocked_by == (reason,)
    assert s.schedule() == []
    s.set_running_elsewhere(full, types)
    assert refs(s.schedule()) == ["old"]
    clock.set(3.0)  # young is urgent too; the cap counts the jobs here: 1 of 2
    assert refs(s.schedule()) == ["young"]


def test_an_urgent_job_taken_from_a_capped_key_leaves_its_queue_consistent():
    # Found by the state machine: the urgent head of a key queue blocked by its key's cap
    # was admitted, and the emptied queue stayed listed as blocked with a live entry.
    s, clock = make(
        capacity=2,
        aging=Aging(interval=0.5, urgent_threshold=2),
        keys={"d": {"max_concurrency": 0}},
        types=[JobType("t", 1)],
        tier_caps={1: None},
    )
    s.submit("a", "t", fairness_key="d")
    assert s.next_admission() is None
    clock.advance(1.0)
    assert s.next_admission().uid == "a"  # urgent: past the cap of 0
    key = s._accounts.keys["d"]
    assert key.blocked is None
    s.submit("b", "t", fairness_key="d")  # not urgent: held by the cap again
    assert s.schedule() == []
    assert [kq.live for kq in key.blocked] == [1]
    clock.advance(1.0)
    assert refs(s.schedule()) == ["b"]
    s.complete("a", 1.0)
    s.complete("b", 1.0)
    assert s.snapshot().running == 0


def test_urgent_jobs_go_before_all_others_oldest_first_whatever_their_keys_used():
    s, clock = make(
        capacity=1,
        aging=Aging(interval=1, max_effective_priority=4, urgent_threshold=4),
        types=[JobType("bg", 1), JobType("fg", 8)],
        tier_caps={1: None, 8: None},
    )
    s.set_key_policies(KeyPolicies.from_mapping({}))
    s.submit("old", "bg", fairness_key="heavy", arrival=0.0)
    s.submit("young", "bg", fairness_key="light", arrival=1.0)
    s.set_accumulated("heavy", 1000.0)
    clock.set(10.0)
    s.submit("fg", "fg", fairness_key="web")
    assert [v.uid for v in s.snapshot().jobs] == ["old", "young", "fg"]
    assert refs(s.schedule()) == ["old"]


def test_time_paused_does_not_count_as_waiting():
    s, clock = make(aging=Aging(interval=10), types=[JobType("t", 1)], tier_caps={1: None})
    s.set_capacity(0)
    s.submit("a", "t", fairness_key="k")
    clock.set(5.0)
    s.pause_key("k")
    clock.set(105.0)
    assert s.status("a").effective_priority == 1  # 5 s of waiting, not 105
    assert s.next_rise() is None  # nothing rises while paused
    s.resume_key("k")
    assert s.next_rise() == 110.0
    clock.set(110.0)
    assert s.status("a").effective_priority == 2
    s.pause_type("t")
    clock.set(200.0)
    s.resume_type("t")
    clock.set(205.0)
    assert s.status("a").effective_priority == 2  # 15 s counted in all


def test_caps_count_against_the_base_tier_while_the_order_uses_the_effective_one():
    s, clock = make(
        capacity=3,
        aging=Aging(interval=1, max_effective_priority=8),
        types=[JobType("bg", 1), JobType("fg", 8)],
        tier_caps={1: 1, 8: None},
    )
    s.submit("bg1", "bg", fairness_key="a")
    s.submit("bg2", "bg", fairness_key="b")
    clock.set(10.0)
    s.submit("fg1", "fg", fairness_key="c")
    assert refs(s.schedule()) == ["bg1", "fg1"]  # bg2 risen to 8 too, but tier 1 is full
    snap = s.snapshot()
    assert snap.running_by_tier == {8: 1, 1: 1}
    bg2 = next(v for v in snap.jobs if v.uid == "bg2")
    assert (bg2.effective_priority, bg2.blocked_by) == (8, (BlockReason.TIER_CAP,))
    running = next(v for v in snap.jobs if v.uid == "bg1")
    assert (running.state, running.priority, running.effective_priority) == (
        JobState.RUNNING,
        1,
        8,
    )


def test_an_older_waiter_on_a_conflict_comes_first_once_it_has_risen_higher():
    # Two keys wait on one repository. The younger key has used less, but the older job
    # rose a level first, so it is the conflict's first waiter when freed.
    s, clock = make(
        capacity=2,
        aging=Aging(interval=4),
        types=[JobType("sync", 1, conflict_group="git")],
        tier_caps={1: None},
    )
    s.submit("holder", "sync", "linux", fairness_key="x")
    assert refs(s.schedule()) == ["holder"]
    s.submit("old", "sync", "linux", fairness_key="heavy")
    s.set_accumulated("heavy", 50.0)
    clock.set(3.0)
    s.submit("young", "sync", "linux", fairness_key="light")
    clock.set(4.0)  # "old" rises to 2, "young" is still 1
    s.complete("holder", 1.0)
    assert refs(s.schedule()) == ["old"]


def test_no_aging_configured_books_nothing_and_keeps_the_seed_order():
    s, clock = make(capacity=1, types=[JobType("t", 1)])
    s.submit("a", "t", fairness_key="a")
    s.submit("b", "t", fairness_key="b")
    clock.set(1e6)
    assert s.next_rise() is None
    view = s.status("b")
    assert (view.effective_priority, view.urgent) == (1, False)
    assert [a.effective_priority for a in s.schedule()] == [1]


def test_a_type_may_age_on_its_own_terms():
    s, clock = make(
        capacity=0,
        aging=Aging(interval=100),
        types=[
            JobType("fast", 1, aging=Aging(interval=1, max_effective_priority=3)),
            JobType("slow", 1),
        ],
        tier_caps={1: None},
    )
    s.submit("f", "fast")
    s.submit("w", "slow")
    clock.set(10.0)
    assert {v.uid: v.effective_priority for v in s.snapshot().jobs} == {"f": 3, "w": 1}
