"""``Scheduler.explain``: why a pending job is not running yet, in words, with its numbers."""

from __future__ import annotations

from celery_fair.core import JobType, KeyPolicies, Scheduler, SchedulerConfig, SimClock

BEHIND_ONE = "behind 1 job that comes first (higher priority, or keys that have used less)"


def make(capacity=4, keys=None, tier_caps=None):
    types = [
        JobType("clone", 8, conflict_group="git"),
        JobType("repack", 4, max_concurrency=1, conflict_group="git"),
        JobType("bg", 1),
    ]
    config = SchedulerConfig(
        capacity, tier_caps=tier_caps or {}, keys=KeyPolicies.from_mapping(keys or {})
    )
    return Scheduler(config, SimClock(), types)


def test_a_held_conflict_names_the_task_that_holds_it_here_or_another_worker():
    s = make()
    s.submit("first", "clone", "linux", "a")
    s.submit("second", "clone", "linux", "b")
    assert [a.ref for a in s.schedule()] == ["first"]
    s._clock.advance(2.5)
    assert s.explain("second") == ["conflict on git:linux held by task first for 2.5 s"]
    s.hold_elsewhere("git", "rails")
    s.submit("third", "clone", "rails", "c")
    assert s.explain("third") == [
        "conflict on git:rails held by a job on another worker",
        BEHIND_ONE,  # second, which waits too
    ]


def test_caps_give_their_numbers_and_what_other_workers_run():
    s = make(keys={"tenant": {"max_concurrency": 1}}, tier_caps={1: 1})
    for ref, jtype, key in [("r1", "repack", "a"), ("t1", "clone", "tenant"), ("b1", "bg", "")]:
        s.submit(ref, jtype, ref, key)
    assert len(s.schedule()) == 3
    s.submit("r2", "repack", "r2", "a")
    s.submit("t2", "clone", "t2", "tenant")
    s.submit("b2", "bg", "b2", "")
    assert s.explain("r2") == ["type cap repack 1/1", BEHIND_ONE]  # t2: priority 8
    assert s.explain("t2") == ["key cap 'tenant' 1/1"]
    assert s.explain("b2")[0] == "tier cap 1 1/1"
    s.set_running_elsewhere({}, {}, {"tenant": 2})
    assert s.explain("t2") == ["key cap 'tenant' 3/1 (2 on other workers)"]


def test_pauses_busy_slots_and_the_jobs_ahead():
    s = make(capacity=1)
    s.submit("a1", "clone", "x", "a")
    assert [a.ref for a in s.schedule()] == ["a1"]
    s.submit("b1", "clone", "y", "b")
    s.submit("b2", "clone", "z", "b")
    assert s.explain("b1") == ["every slot busy 1/1"]
    assert s.explain("b2") == ["every slot busy 1/1", BEHIND_ONE]
    s.pause_key("b")
    assert s.explain("b1")[0] == "paused (key 'b')"
    s.resume_key("b")
    s.pause_type("clone")
    assert s.explain("b1")[0] == "paused (type clone)"
    s.resume_type("clone")
    s.complete("a1", 1.0)
    assert s.explain("b1") == ["first in line: it starts at the next decision"]
    assert s.explain("a1") == []  # not pending (done)
    assert s.explain("nobody") == []
