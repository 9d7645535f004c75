"""``Scheduler.expected_wait``: the work ahead of a pending job, shared by the slots."""

from __future__ import annotations

import pytest

from celery_fair.core import BlockReason, JobType, Scheduler, SchedulerConfig, SimClock


def make(capacity=2):
    return Scheduler(SchedulerConfig(capacity), SimClock(), [JobType("clone", 8)])


def test_the_running_jobs_time_left_and_the_jobs_ahead_are_shared_by_the_slots():
    s = make()
    s.submit("r1", "clone", "r1", "a", cost=1.0)
    s.submit("r2", "clone", "r2", "b", cost=3.0)
    assert {a.uid for a in s.schedule()} == {"r1", "r2"}
    s._clock.advance(0.5)
    # two pending jobs of a key that has used nothing: p1 first (it arrived first)
    s.submit("p1", "clone", "p1", "c", cost=2.0)
    s.submit("p2", "clone", "p2", "c", cost=1.0)
    # time left: 0.5 (r1) + 2.5 (r2); p1 waits for that, shared by the 2 slots,
    assert s.expected_wait("p1") == pytest.approx((0.5 + 2.5) / 2)
    # p2 for that and p1's 2 s (2.5 s), but no less than p1's 2 s at key c's share of the
    # slots: three keys with work share 2 slots, 2/3 each (3 s)
    assert s.expected_wait("p2") == pytest.approx(max((0.5 + 2.5 + 2.0) / 2, 2.0 / (2 / 3)))
    assert s.expected_wait("p2", slots=1) == pytest.approx(2.0 / (1 / 3))
    # a running job overdue counts for nothing left; running and unknown jobs have no wait
    s._clock.advance(1.0)
    assert s.expected_wait("p1") == pytest.approx((0.0 + 1.5) / 2)
    assert s.expected_wait("r1") is None
    assert s.expected_wait("nobody") is None


def test_the_learned_estimate_counts_for_a_job_without_a_cost():
    s = make(capacity=1)
    s.submit("r1", "clone", "linux", "a")
    s.schedule()
    s._clock.advance(4.0)
    s.complete("r1", 4.0)  # learns 4 s for clone:linux
    s.submit("r2", "clone", "linux", "a")
    s.schedule()
    s.submit("p1", "clone", "linux", "b")
    s.submit("p2", "clone", "git", "b")
    ahead = s.estimate("clone", "linux")
    assert ahead > 1.0  # learned, not the default cost
    assert s.expected_wait("p2") == pytest.approx(ahead + ahead)


def test_a_key_alone_is_served_by_every_slot():
    s = make(capacity=2)
    for i in range(4):
        s.submit(f"j{i}", "clone", f"j{i}", "a", cost=1.0)
    s.schedule()  # j0, j1 run
    # j3 waits for j2's 1 s and what j0 and j1 have left (2 s), shared by 2 slots: 1.5 s;
    # key a, alone, has both slots: j2's 1 s at 2 slots is 0.5 s, less
    assert s.expected_wait("j3") == pytest.approx(1.5)


def test_a_job_of_a_paused_key_or_a_capped_type_has_no_expected_start_but_what_it_waits_for():
    s = Scheduler(SchedulerConfig(2), SimClock(), [JobType("clone", 8, max_concurrency=1)])
    s.submit("r1", "clone", "r1", "a", cost=1.0)
    s.schedule()  # r1 runs: the type's cap is reached, one slot is free
    s.submit("capped", "clone", "x", "b", cost=1.0)
    start = s.expected_start("capped")
    assert (start.seconds, start.waits_for) == (None, BlockReason.TYPE_CAP)
    s2 = make(capacity=1)
    s2.submit("r1", "clone", "r1", "a", cost=0.2)
    s2.schedule()
    s2.pause_key("spam")
    s2.submit("p1", "clone", "p1", "spam", cost=1.0)
    # (it used to be expected in the running job's 0.2 s: a paused key's share is 0)
    start = s2.expected_start("p1")
    assert (start.seconds, start.waits_for) == (None, BlockReason.PAUSED)
    assert s2.expected_wait("p1") is None


def test_a_resource_never_seen_counts_at_its_types_learned_cost_and_defaults_are_named():
    # Given a type whose default_cost (10 s) is far from what its jobs take (about 1 s),
    s = Scheduler(SchedulerConfig(1), SimClock(), [JobType("clone", 8, default_cost=10.0)])
    for i in range(3):
        s.submit(f"q{i}", "clone", f"new{i}", "a")
    s.schedule()
    # when nothing of the type is learned yet, the estimate is all default costs, and says so,
    start = s.expected_start("q2")
    assert start.seconds == pytest.approx(20.0)
    assert start.from_defaults == 1.0
    s._clock.advance(1.0)
    s.complete("q0", 1.0)  # learns clone:new0 (1 s with alpha's weight on the 10 s default)
    learned = s.estimate("clone", "new0")
    assert learned < 10.0
    # then a job behind more never-seen resources counts each at the type's learned cost,
    s.schedule()  # q1 runs
    for i in range(3, 6):
        s.submit(f"q{i}", "clone", f"new{i}", "b")
    start = s.expected_start("q5")
    ahead = [learned] * 4  # q1 (running, just admitted), q2, q3, q4
    assert start.seconds == pytest.approx(sum(ahead))  # not 40 s of defaults
    assert start.from_defaults == 0.0
