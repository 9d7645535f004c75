"""A job's own priority (at submit, or changed while it waits) on the real core."""

from __future__ import annotations

import pytest

from celery_fair import words
from celery_fair.core import (
    Aging,
    BlockReason,
    JobType,
    PriorityOutcome,
    Scheduler,
    SchedulerConfig,
    SimClock,
)
from celery_fair.errors import SchedulerError


def core(*types, capacity=1, **config):
    clock = SimClock()
    return Scheduler(SchedulerConfig(capacity, **config), clock, types), clock


def admitted(s):
    return [a.uid for a in s.schedule()]


def test_a_held_job_moved_to_a_higher_priority_goes_before_the_backlog_it_waited_behind():
    s, clock = core(JobType("build", priority=2))
    for i in range(5):
        s.submit(f"b{i}", "build", fairness_key="bulk")
    s.submit("late", "build", fairness_key="bulk")
    assert s.status("late").place == 6
    clock.advance(1)
    assert s.reprioritize("late", 5) is PriorityOutcome.OK
    view = s.status("late")
    assert (view.place, view.priority, view.arrival) == (1, 5, 1.0)
    a = s.next_admission()
    assert (a.uid, a.priority) == ("late", 5)
    # and back to its type's own priority: behind its key's jobs again, as a new arrival
    s.complete("late", 1.0)
    s.submit("again", "build", fairness_key="bulk", priority=7)
    assert s.reprioritize("again", None) is PriorityOutcome.OK
    assert s.status("again").priority == 2
    assert s.status("again").place == 6


def test_the_answers_for_a_running_and_an_unknown_job_and_a_bad_priority():
    s, _ = core(JobType("build", priority=2))
    s.submit("r", "build")
    assert admitted(s) == ["r"]
    assert s.reprioritize("r", 9) is PriorityOutcome.RUNNING
    assert s.reprioritize("nobody", 9) is PriorityOutcome.UNKNOWN
    s.submit("p", "build")
    for bad in (0, -1, 2.5, True, "3"):
        with pytest.raises(SchedulerError, match="priority must be a positive int"):
            s.reprioritize("p", bad)
        with pytest.raises(SchedulerError, match="priority must be a positive int"):
            s.submit("q", "build", priority=bad)
    assert s.status("p").priority == 2
    assert "q" not in s


def test_the_types_cap_spans_its_jobs_at_every_priority_and_the_tier_cap_is_the_new_ones():
    s, _ = core(
        JobType("repack", priority=3, max_concurrency=2),
        JobType("scan", priority=5),
        capacity=10,
        tier_caps={5: 1, 3: None},
    )
    s.submit("r1", "repack")
    s.submit("r2", "repack", priority=5)
    s.submit("r3", "repack", priority=8)
    s.submit("s1", "scan")
    got = s.schedule()
    # repack's cap of 2 holds across its lanes at 8, 5 and 3; tier 5 holds one job: r2 is
    # admitted before s1 (same tier, earlier), so s1 waits for the tier, r1 for the type
    assert [(a.uid, a.priority) for a in got] == [("r3", 8), ("r2", 5)]
    assert BlockReason.TYPE_CAP in s.status("r1").blocked_by
    assert BlockReason.TIER_CAP in s.status("s1").blocked_by
    assert s.by_type()[0] == ("repack", 3, 1, 2)  # one type: pending 1, running 2
    s.complete("r3", 1.0)
    assert admitted(s) == ["r1"]
    assert words.lines(s.why("s1"))[0].startswith("tier cap 5 1/1")


def test_a_type_paused_stops_its_jobs_at_every_priority():
    s, _ = core(JobType("build", priority=2), capacity=4)
    s.submit("a", "build", priority=6)
    s.submit("b", "build")
    s.pause_type("build")
    assert admitted(s) == []
    assert BlockReason.PAUSED in s.status("a").blocked_by
    s.resume_type("build")
    assert admitted(s) == ["a", "b"]


def test_reprioritising_restarts_the_aging_clock():
    aging = Aging(interval=10, grace=0, max_effective_priority=9)
    s, clock = core(JobType("build", priority=2, aging=aging))
    s.submit("old", "build", fairness_key="k")
    clock.advance(35)
    assert s.status("old").effective_priority == 5
    assert s.reprioritize("old", 4) is PriorityOutcome.OK
    assert s.status("old").effective_priority == 4  # from 4, waited 0 s
    clock.advance(10)
    assert s.status("old").effective_priority == 5


def test_a_job_waiting_on_a_conflict_moves_and_still_waits_for_it():
    s, _ = core(JobType("fetch", priority=2, conflict_group="git"), capacity=3)
    s.submit("holder", "fetch", "linux")
    assert admitted(s) == ["holder"]
    s.submit("waiter", "fetch", "linux")
    s.submit("other", "fetch", "git")
    assert s.reprioritize("waiter", 9) is PriorityOutcome.OK
    assert admitted(s) == ["other"]
    assert BlockReason.CONFLICT in s.status("waiter").blocked_by
    s.complete("holder", 1.0)
    a = s.next_admission()
    assert (a.uid, a.priority) == ("waiter", 9)


def test_a_job_moved_twice_within_one_queue_is_admitted_once_at_its_new_place():
    # Its old record's entries stay behind in the queue it left: they must not come alive.
    s, _clock = core(JobType("build", priority=2), capacity=1)
    s.submit("a", "build", fairness_key="k")
    s.submit("b", "build", fairness_key="k")
    assert s.reprioritize("a", 4) is PriorityOutcome.OK
    assert s.reprioritize("a", None) is PriorityOutcome.OK  # back in the queue it left
    assert [v.uid for v in s.snapshot().jobs] == ["b", "a"]
    assert admitted(s) == ["b"]
    s.complete("b", 1.0)
    assert admitted(s) == ["a"]
    s.complete("a", 1.0)
    assert admitted(s) == []
    assert s.pending == 0
