"""``Scheduler.expected_wait``: the work ahead of a pending job, shared by the slots."""

from __future__ import annotations

import pytest

from celery_fair.core import JobType, Scheduler, SchedulerConfig, SimClock


def make(capacity=2):
    return Scheduler(SchedulerConfig(capacity), SimClock(), [JobType("clone", 8)])


def test_the_running_jobs_time_left_and_the_jobs_ahead_are_shared_by_the_slots():
    s = make()
    s.submit("r1", "clone", "r1", "a", cost=1.0)
    s.submit("r2", "clone", "r2", "b", cost=3.0)
    assert {a.ref for a in s.schedule()} == {"r1", "r2"}
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
