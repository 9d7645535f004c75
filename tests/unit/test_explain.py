"""``Scheduler.why`` and ``words.lines``: why a pending job is not running yet, as values and,
written at the edge, in words, with its numbers."""

from __future__ import annotations

from celery_fair import words
from celery_fair.core import (
    BlockReason,
    JobType,
    KeyPolicies,
    Scheduler,
    SchedulerConfig,
    SimClock,
)
from celery_fair.core.inspect import CapFull, ConflictHeld, Paused, SlotsBusy, Why

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


def explain(s, ref):
    """Why ``ref`` waits, in words, as the edge writes it (job control, ``fair.slot``)."""
    return words.lines(s.why(ref))


def test_a_held_conflict_names_the_task_that_holds_it_here_or_another_worker():
    s = make()
    s.submit("first", "clone", "linux", "a")
    s.submit("second", "clone", "linux", "b")
    assert [a.uid for a in s.schedule()] == ["first"]
    s._clock.advance(2.5)
    assert explain(s, "second") == ["conflict on git:linux held by task first for 2.5 s"]
    s.hold_elsewhere("git", "rails")
    s.submit("third", "clone", "rails", "c")
    assert explain(s, "third") == [
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
    assert explain(s, "r2") == ["type cap repack 1/1", BEHIND_ONE]  # t2: priority 8
    assert explain(s, "t2") == ["key cap 'tenant' 1/1"]
    assert explain(s, "b2")[0] == "tier cap 1 1/1"
    s.set_running_elsewhere({}, {}, {"tenant": 2})
    assert explain(s, "t2") == ["key cap 'tenant' 3/1 (2 on other workers)"]


def test_pauses_busy_slots_and_the_jobs_ahead():
    s = make(capacity=1)
    s.submit("a1", "clone", "x", "a")
    assert [a.uid for a in s.schedule()] == ["a1"]
    s.submit("b1", "clone", "y", "b")
    s.submit("b2", "clone", "z", "b")
    assert explain(s, "b1") == ["every slot busy 1/1"]
    assert explain(s, "b2") == ["every slot busy 1/1", BEHIND_ONE]
    s.pause_key("b")
    assert explain(s, "b1")[0] == "paused (key 'b')"
    s.resume_key("b")
    s.pause_type("clone")
    assert explain(s, "b1")[0] == "paused (type clone)"
    s.resume_type("clone")
    s.complete("a1", 1.0)
    assert explain(s, "b1") == ["first in line: it starts at the next decision"]
    assert explain(s, "a1") == []  # not pending (done)
    assert explain(s, "nobody") == []


def test_why_gives_the_same_answer_as_values_that_the_words_are_written_from():
    """``Scheduler.why``: the blockers with their numbers, in ``BLOCK_ORDER``, and the jobs
    ahead; the words are ``words.lines`` of it, so both say the same thing."""
    s = make(capacity=2, keys={"tenant": {"max_concurrency": 1}})
    s.submit("first", "clone", "linux", "tenant")
    s.submit("r1", "repack", "r1", "a")
    assert [a.uid for a in s.schedule()] == ["first", "r1"]
    s._clock.advance(1.5)
    s.submit("second", "clone", "linux", "tenant")
    s.submit("r2", "repack", "r2", "b")
    s.hold_elsewhere("git", "rails")
    s.submit("third", "clone", "rails", "c")
    s.set_running_elsewhere({}, {"repack": 1}, {"tenant": 1})
    assert s.why("second") == Why(
        (
            ConflictHeld("git", "linux", "first", 1.5),
            CapFull(BlockReason.KEY_CAP, "tenant", 1, 1, 1),
            SlotsBusy(2, 2),
        ),
        1,  # third: its key has used less
    )
    assert s.why("r2") == Why(
        (CapFull(BlockReason.TYPE_CAP, "repack", 1, 1, 1), SlotsBusy(2, 2)), 2
    )
    assert s.why("third") == Why((ConflictHeld("git", "rails"), SlotsBusy(2, 2)), 0)
    assert explain(s, "second") == [
        "conflict on git:linux held by task first for 1.5 s",
        "key cap 'tenant' 2/1 (1 on other workers)",
        "every slot busy 2/2",
        BEHIND_ONE,
    ]
    assert explain(s, "r2") == [
        "type cap repack 2/1 (1 on other workers)",
        "every slot busy 2/2",
        "behind 2 jobs that come first (higher priority, or keys that have used less)",
    ]
    assert explain(s, "third") == [
        "conflict on git:rails held by a job on another worker",
        "every slot busy 2/2",
    ]
    s.pause_type("clone")
    assert s.why("third").blockers[0] == Paused(type="clone")
    assert explain(s, "third")[0] == "paused (type clone)"
    assert s.why("first") is None  # running
    assert s.why("nobody") is None
    assert words.lines(Why((), 0)) == [words.FIRST]
