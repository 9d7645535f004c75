"""Weights, caps and pauses by fairness key, and pauses by type, on the real core."""

from __future__ import annotations

import pytest
from helpers import drain, make, refs

from celery_fair.core import (
    BlockReason,
    JobType,
    KeyPolicies,
    KeyPolicy,
    Scheduler,
    SchedulerConfig,
    SimClock,
)
from celery_fair.errors import ConfigurationError, UnknownJobType

CLONE = ("clone", 8, None, "", 1)
GIT = ("fetch", 8, None, "git", 1)


def keys(spec):
    return KeyPolicies.from_mapping(spec)


# -- which policy a key has ----------------------------------------------------------------


def test_an_exact_name_wins_over_a_pattern_and_patterns_go_in_order_before_the_default():
    p = keys(
        {
            "tenant:*": {"weight": 2},
            "tenant:a?": {"weight": 5},
            "tenant:acme": {"max_concurrency": 1},
            "*": {"weight": 0.5},
        }
    )
    assert p.for_key("tenant:acme") == KeyPolicy(max_concurrency=1)
    assert p.for_key("tenant:ab") == KeyPolicy(weight=2)  # the first pattern that matches
    assert p.for_key("other") == KeyPolicy(weight=0.5)
    assert not p.trivial
    assert KeyPolicies().trivial


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"a": {"weight": 0}}, "weight must be a positive number"),
        ({"a": {"weight": True}}, "weight must be a positive number"),
        ({"a": {"max_concurrency": -1}}, "max_concurrency must be an int >= 0"),
        ({"a": {"speed": 3}}, "unknown option(s) ['speed']"),
        ({"a": 3}, "must be a mapping"),
    ],
)
def test_a_bad_policy_is_refused_with_its_name(spec, words):
    with pytest.raises(ConfigurationError) as err:
        keys(spec)
    assert words in str(err.value)


# -- weights ---------------------------------------------------------------------------------


def test_a_key_of_weight_3_gets_three_admissions_for_each_of_a_key_of_weight_1():
    s, _ = make(1, [CLONE], keys=keys({"heavy": {"weight": 3}}))
    for i in range(12):
        s.submit(f"h{i}", "clone", None, "heavy")
        s.submit(f"l{i}", "clone", None, "light")
    order = drain(s)[:16]
    assert sum(r.startswith("h") for r in order) == 12
    assert sum(r.startswith("l") for r in order) == 4
    # Charged estimate / weight: 12 jobs of 1 at weight 3 is 4, the light key's 4 jobs are 4.
    assert s.accumulated_cost("heavy") == pytest.approx(4.0)


def test_a_refused_admission_refunds_exactly_what_was_charged():
    s, _ = make(2, [CLONE], keys=keys({"k": {"weight": 4}}))
    s.submit("a", "clone", None, "k", cost=2)
    s.submit("b", "clone", None, "k", cost=2)
    s.schedule()
    assert s.accumulated_cost("k") == 1.0
    s.revert("b")
    assert s.accumulated_cost("k") == 0.5


# -- caps by key ---------------------------------------------------------------------------------


def test_a_key_at_its_cap_waits_and_the_slots_go_to_the_others():
    s, _ = make(4, [CLONE], keys=keys({"a": {"max_concurrency": 2}}))
    for i in range(5):
        s.submit(f"a{i}", "clone", None, "a")
    for i in range(5):
        s.submit(f"b{i}", "clone", None, "b")
    assert sorted(refs(s.schedule())) == ["a0", "a1", "b0", "b1"]
    s.complete("b0", 1.0)
    assert refs(s.schedule()) == ["b2"]  # a is at its cap: b's job goes, though a is cheaper
    assert s.status("a2").blocked_by == (BlockReason.CAPACITY, BlockReason.KEY_CAP)
    assert s.blocked_counts()["key_cap"] == 3
    s.complete("a0", 1.0)
    assert refs(s.schedule()) == ["a2"]  # a below its cap again: first, by cost


def test_a_blocked_key_leaves_the_heap_whole_and_no_decision_looks_at_it_again():
    s, _ = make(2, [CLONE], keys=keys({"a": {"max_concurrency": 1}}))
    for i in range(1000):
        s.submit(f"a{i}", "clone", None, "a")
    s.submit("b0", "clone", None, "b")
    assert refs(s.schedule()) == ["a0", "b0"]
    lane = s._lanes["clone"]
    key = s._accounts.keys["a"]
    (kq,) = key.blocked
    assert kq.blocked
    assert kq.live == 999
    assert all(entry[-1] is not kq or entry[3] != kq.ver for entry in lane.queue.heap)
    for i in range(1, 50):  # b's jobs come and go; a's 999 are never met
        s.submit(f"b{i}", "clone", None, "b")
        s.complete(f"b{i - 1}", 1.0)
        assert refs(s.schedule()) == [f"b{i}"]
        assert len(lane.queue.heap) <= 2
    s.complete("a0", 1.0)
    assert key.blocked is None
    assert refs(s.schedule()) == ["a1"]


def test_a_capped_keys_waiter_gives_way_to_another_keys_on_a_freed_conflict():
    s, _ = make(4, [GIT], keys=keys({"a": {"max_concurrency": 1}}))
    s.submit("hold", "fetch", "repo", "c")
    s.submit("a-other", "fetch", "elsewhere", "a")
    assert refs(s.schedule()) == ["hold", "a-other"]  # a is at its cap now
    s.submit("a-repo", "fetch", "repo", "a", cost=0)  # waits for repo, key a cheapest
    s.submit("b-repo", "fetch", "repo", "b", cost=0)
    assert s.schedule() == []
    s.complete("hold", 1.0)  # repo is free: a's waiter is first by cost, but a is capped
    assert refs(s.schedule()) == ["b-repo"]
    s.complete("b-repo", 1.0)
    s.complete("a-other", 1.0)
    assert refs(s.schedule()) == ["a-repo"]


def test_raising_a_cap_at_run_time_lets_the_key_run_at_once_and_lowering_it_holds_it():
    s, _ = make(4, [CLONE], keys=keys({"a": {"max_concurrency": 1}}))
    for i in range(4):
        s.submit(f"a{i}", "clone", None, "a")
    assert refs(s.schedule()) == ["a0"]
    s.set_key_policies(keys({"a": {"max_concurrency": 3}}))
    assert refs(s.schedule()) == ["a1", "a2"]
    s.set_key_policies(keys({"a": {"max_concurrency": 2}}))
    s.complete("a0", 1.0)
    assert s.schedule() == []  # 2 still run: at the new cap
    s.set_key_policies(KeyPolicies())
    assert refs(s.schedule()) == ["a3"]


def test_what_other_workers_run_of_a_key_counts_against_its_cap():
    s, _ = make(4, [CLONE], keys=keys({"a": {"max_concurrency": 3}}))
    for i in range(4):
        s.submit(f"a{i}", "clone", None, "a")
    s.set_running_elsewhere({}, {}, {"a": 2})
    assert refs(s.schedule()) == ["a0"]
    s.set_running_elsewhere({}, {}, {})
    assert refs(s.schedule()) == ["a1", "a2"]


# -- pauses ----------------------------------------------------------------------------------


def test_a_paused_key_keeps_its_jobs_in_order_and_resumes_where_it_stopped():
    s, _ = make(2, [CLONE])
    s.pause_key("a")  # before the key is known
    for i in range(3):
        s.submit(f"a{i}", "clone", None, "a")
    s.submit("b0", "clone", None, "b")
    assert refs(s.schedule()) == ["b0"]
    assert s.status("a0").blocked_by == (BlockReason.PAUSED,)
    assert s.pending_of("a") == 3
    assert s.paused == (frozenset({"a"}), frozenset())
    s.resume_key("a")
    assert refs(s.schedule()) == ["a0"]
    s.complete("a0", 1.0)
    s.complete("b0", 1.0)
    assert drain(s) == ["a1", "a2"]


def test_a_paused_type_is_skipped_and_its_jobs_wait():
    s, _ = make(2, [CLONE, ("repack", 4, None, "", 1)])
    s.submit("r", "repack", None, "a")
    s.pause_type("repack")
    assert s.schedule() == []
    assert s.blocked_counts()["paused"] == 1
    s.resume_type("repack")
    assert refs(s.schedule()) == ["r"]
    with pytest.raises(UnknownJobType):
        s.pause_type("nope")


def test_a_job_of_a_capped_or_paused_key_outranks_nothing():
    s, _ = make(2, [CLONE], keys=keys({"a": {"max_concurrency": 1}}))
    s.submit("b0", "clone", None, "b")
    s.submit("a0", "clone", None, "a")
    admitted = s.schedule()
    s.set_accumulated("a", 10)  # both far ahead of a newcomer now
    s.set_accumulated("b", 10)
    s.submit("a1", "clone", None, "a")
    assert not s.outranks("a1", admitted)  # a runs a0: at its cap
    s.submit("c0", "clone", None, "c")
    assert s.outranks("c0", admitted)
    s.pause_key("c")
    assert not s.outranks("c0", admitted)


# -- minimum slots -------------------------------------------------------------------------


def test_a_key_below_its_minimum_goes_first_until_it_runs_that_many():
    s, _ = make(4, [CLONE], keys=keys({"ops": {"min_slots": 2}}))
    s.submit("a0", "clone", None, "a")
    for i in range(4):
        s.submit(f"ops{i}", "clone", None, "ops")
    s.set_accumulated("ops", 50.0)  # ops has used far more than a
    s.submit("a1", "clone", None, "a")
    # ops runs nothing: below its minimum, its jobs go first though its cost is the higher,
    assert refs(s.schedule()) == ["ops0", "ops1", "a0", "a1"]
    s.complete("a0", 1.0)
    assert refs(s.schedule()) == ["ops2"]  # a has no more work: the slot is not kept idle
    s.complete("ops0", 1.0)
    s.complete("ops1", 1.0)  # ops runs 1 now: below its minimum again
    s.submit("a2", "clone", None, "a")
    assert refs(s.schedule()) == ["ops3", "a2"]


def test_what_other_workers_run_of_a_key_counts_toward_its_minimum():
    s, _ = make(2, [CLONE], keys=keys({"ops": {"min_slots": 1}}))
    s.submit("a0", "clone", None, "a")
    s.submit("ops0", "clone", None, "ops")
    s.set_accumulated("ops", 50.0)
    s.set_running_elsewhere({}, {}, {"ops": 1})  # ops has its one elsewhere
    assert refs(s.schedule()) == ["a0", "ops0"]


def test_the_allocation_view_follows_the_keys_with_work_and_their_policies():
    s, _ = make(
        16,
        [CLONE],
        keys=keys(
            {"A": {"weight": 3, "max_concurrency": 12}, "B": {"min_slots": 2, "max_concurrency": 6}}
        ),
    )
    for i in range(40):
        s.submit(f"a{i}", "clone", None, "A")
    for i in range(3):
        s.submit(f"b{i}", "clone", None, "B")
    assert s.allocation() == ({"A": 12, "B": 3}, 1)
    s.pause_key("B")
    assert s.allocation() == ({"A": 12, "B": 0}, 4)


def test_the_last_waiter_of_a_paused_key_cancelled_on_a_free_conflict_leaves_nothing_behind():
    clock = SimClock()
    s = Scheduler(SchedulerConfig(1), clock, [JobType("t", 1, conflict_group="git")])
    s.submit("a", "t", "r1")
    assert [a.uid for a in s.schedule()] == ["a"]
    s.pause_key("")
    s.submit("b", "t", "r1")  # parked on the held conflict
    s.release("a")  # the conflict is free, its only waiter's key paused: nothing may start
    s.cancel("b")
    assert s._conflicts == {}


# -- the keys' terms alone (core/keys.py), without a scheduler ------------------------------


def test_key_rules_give_a_key_its_terms_by_name_before_and_after_it_appears():
    from celery_fair.core.aging import Agenda
    from celery_fair.core.costs import Accounts
    from celery_fair.core.keys import KeyRules
    from celery_fair.core.types import CostLifecycle

    accounts = Accounts(CostLifecycle(), 0.0)
    rules = KeyRules(
        accounts, keys({"tenant:*": {"max_concurrency": 2, "weight": 3}}), True, Agenda(0.0)
    )
    rules.pause_key("tenant:b", True)  # not known yet: paused when it appears
    rules.set_elsewhere({"tenant:a": 2})
    a, b, c = (accounts.get(name) for name in ("tenant:a", "tenant:b", "other"))
    for key in (a, b, c):
        rules.adopt(key)
    assert (a.limit, a.weight, a.elsewhere, a.cap, a.paused) == (2, 3.0, 2, 0, False)
    assert (b.cap, b.paused) == (0, True)
    assert rules.terms("other") == (None, 1.0)
    assert rules.terms("tenant:z") == (2, 3.0)
    assert rules.limits() == {"tenant:a": 2, "tenant:b": 2}
    rules.set_elsewhere({})  # the other workers' jobs ended: a runs again
    rules.pause_key("tenant:b", False)
    assert (a.elsewhere, a.cap, b.cap, b.paused) == (0, 2, 2, False)
    a.pending = c.pending = 1
    rules.reshare_due = False
    rules.demand_moved(a, 1)
    assert rules.reshare_due  # a's room crossed its share (0 before any reshare)
    rules.reshare(4)
    assert rules.allocation(4).slots == {"tenant:a": 1, "other": 1}
    assert (a.share, c.share, rules.reshare_due) == (1, 1, False)
