"""Two-level keys in the core (issue 34 part 2, docs/design.md 5g): tenants are served fairly
first, then the keys within the chosen tenant. Hand-computed cases; the property tests
compare every decision with the reference oracle."""

from __future__ import annotations

import pytest
from helpers import make, refs

from celery_fair.core import Aging, BlockReason, CostLifecycle, KeyPolicies, SchedulerConfig
from celery_fair.core.inspect import why_from_dict, why_to_dict
from celery_fair.errors import ConfigurationError
from celery_fair.words import line

JOB = ("job", 1, None, "", 1.0)
CLONE = ("clone", 1, None, "git", 1.0)


def tenants(capacity=1, keys=None, **config):
    return make(
        capacity,
        [JOB, CLONE],
        key_separator="/",
        keys=KeyPolicies.from_mapping(keys or {}),
        tier_caps={1: None},
        **config,
    )


def run_one_at_a_time(s, n):
    """Admit and finish ``n`` jobs, one slot at a time: their keys in start order."""
    out = []
    for _ in range(n):
        (a,) = s.schedule()
        out.append(a.fairness_key)
        s.complete(a.uid, 1.0)
    return out


def backlog(s, key, n, type="job", job_id=None):
    for i in range(n):
        s.submit(f"{key}#{i}", type, job_id, key)


def test_a_tenant_on_ten_keys_gets_one_share_not_ten():
    s, _ = tenants()
    for k in range(10):
        backlog(s, f"S/{k}", 3)
    backlog(s, "T", 10)
    started = run_one_at_a_time(s, 20)
    # T (one key) and S (ten) take turns: every other start is T's.
    assert started[1::2] == ["T"] * 10
    # Within S, its keys take turns too.
    assert started[0::2] == [f"S/{k}" for k in range(10)]


def test_flat_keys_give_the_same_backlog_ten_shares():
    s, _ = make(1, [JOB])
    for k in range(10):
        backlog(s, f"S/{k}", 3)
    backlog(s, "T", 10)
    started = run_one_at_a_time(s, 22)
    assert started.count("T") == 2  # one start in eleven


def test_a_tenants_weight_and_its_keys_weights_apply_at_their_levels():
    s, _ = tenants(keys={"S": {"weight": 2}, "S/a": {"weight": 3}})
    backlog(s, "S/a", 20)
    backlog(s, "S/b", 20)
    backlog(s, "T/x", 20)
    started = run_one_at_a_time(s, 24)
    # S weighs 2 against T's 1: 16 of 24 starts; within S, a weighs 3 against b's 1.
    assert started.count("T/x") == 8
    assert started.count("S/a") == 12
    assert started.count("S/b") == 4


def test_a_key_without_the_separator_is_a_tenant_of_one_key_and_star_names_every_tenant():
    s, _ = tenants(capacity=4, keys={"*": {"max_concurrency": 1}})
    backlog(s, "solo", 3)
    backlog(s, "S/a", 3)
    backlog(s, "S/b", 3)
    # Every tenant runs at most one job, over all its keys: solo one, S one.
    assert sorted(a.fairness_key for a in s.schedule()) in (["S/a", "solo"], ["S/b", "solo"])


def test_a_tenants_cap_holds_over_all_its_keys_and_its_slots_go_to_others():
    s, _ = tenants(capacity=4, keys={"S": {"max_concurrency": 2}})
    for k in range(5):
        backlog(s, f"S/{k}", 2)
    backlog(s, "T/x", 4)
    got = s.schedule()
    keys = [a.fairness_key for a in got]
    assert len(got) == 4
    assert sum(k.startswith("S/") for k in keys) == 2
    assert keys.count("T/x") == 2
    # A job of S waits for its tenant's cap, and says so (its key's cap holds nothing back).
    view = s.status("S/4#0")
    assert view is not None
    assert BlockReason.TENANT_CAP in view.blocked_by
    assert BlockReason.KEY_CAP not in view.blocked_by
    assert s.blocked_counts()["tenant_cap"] == 8
    # One of S's jobs ends: T and S have used 2 each, and the tie goes to the earlier
    # submission, S's.
    first_s = next(a for a in got if a.fairness_key.startswith("S/"))
    s.complete(first_s.uid, 1.0)
    (again,) = s.schedule()
    assert again.fairness_key.startswith("S/")


def test_a_key_cap_inside_a_tenant_holds_beside_the_tenants():
    s, _ = tenants(capacity=4, keys={"S/a": {"max_concurrency": 1}})
    backlog(s, "S/a", 4)
    got = s.schedule()
    assert refs(got) == ["S/a#0"]  # S/a at its own cap; no other key has work


def test_a_tenants_minimum_puts_it_first_until_it_runs_that_many():
    s, _ = tenants(capacity=3, keys={"T": {"min_slots": 2}})
    backlog(s, "S/a", 5)
    backlog(s, "S/b", 5)
    s.submit("t1", "job", None, "T/x")
    s.submit("t2", "job", None, "T/y")
    got = refs(s.schedule())
    assert got[:2] == ["t1", "t2"]


def test_the_lower_of_a_keys_and_its_tenants_max_priority_bounds_its_jobs():
    s, _ = tenants(keys={"S": {"max_priority": 4}, "S/a": {"max_priority": 6}})
    assert s.priority_for("job", "S/a", 8) == 4
    assert s.priority_for("job", "S/b", 8) == 4
    assert s.priority_for("job", "T/a", 8) == 8


def test_a_freed_conflicts_first_waiter_is_by_tenant_then_key():
    s, _ = tenants(capacity=2)
    s.submit("holder", "clone", "linux", "S/a")
    assert refs(s.schedule()) == ["holder"]
    # Waiters of the same repository from S's other keys and from T: T has used nothing.
    s.submit("s1", "clone", "linux", "S/b")
    s.submit("s2", "clone", "linux", "S/c")
    s.submit("t1", "clone", "linux", "T/x")
    assert s.schedule() == []
    s.complete("holder", 1.0)
    assert refs(s.schedule()) == ["t1"]


def test_a_reverted_admission_refunds_the_tenant_too():
    s, _ = tenants(capacity=2)
    backlog(s, "S/a", 2)
    s.submit("t1", "job", None, "T/x")
    got = refs(s.schedule())
    assert got == ["S/a#0", "t1"]
    s.revert("S/a#0")
    assert s._tenants.keys["S"].acc == 0
    assert refs(s.schedule()) == ["S/a#0"]


def test_an_admission_of_another_tenant_is_outranked_by_tenant_cost():
    s, _ = tenants(capacity=1)
    backlog(s, "S/a", 3)
    for _ in range(3):  # S has used 3
        (a,) = s.schedule()
        s.complete(a.uid, 1.0)
    s.submit("s-next", "job", None, "S/b")  # a new key of S, which has used 3 as a tenant
    (admitted,) = s.schedule()
    s.submit("t1", "job", None, "T/x")
    # T has used nothing: it goes before an admission of S's, though S/b had used nothing.
    assert s.outranks("t1", [admitted])


def test_an_idle_tenant_is_forgotten_after_the_cost_ttl():
    s, clock = tenants(lifecycle=CostLifecycle(cost_ttl=10, estimate_ttl=None))
    s.submit("a", "job", None, "S/a")
    assert refs(s.schedule()) == ["a"]
    s.complete("a", 1.0)
    clock.advance(11)
    s.submit("b", "job", None, "T/x")  # any operation applies the lifecycle
    assert "S" not in s._tenants.keys
    assert "S/a" not in s._accounts.keys


def test_a_returning_tenant_starts_from_the_least_active_tenants_cost():
    s, _ = tenants(lifecycle=CostLifecycle(cost_ttl=None, estimate_ttl=None, advance_idle=True))
    backlog(s, "T/x", 6)
    run_one_at_a_time(s, 4)  # T has used 4 and still has work
    s.submit("s1", "job", None, "S/a")
    assert s._tenants.keys["S"].acc == 4
    assert s.accumulated_cost("S/a") == 0  # the first key of its tenant: no floor among them


@pytest.mark.parametrize("separator", ["", "//", "*", "?", "[", 1])
def test_a_separator_must_be_one_character_that_patterns_do_not_use(separator):
    with pytest.raises(ConfigurationError, match="key_separator"):
        SchedulerConfig(1, key_separator=separator)


@pytest.mark.parametrize("caps", [True, False])
def test_with_allocation_caps_tenants_get_their_allocation_then_their_keys_theirs(caps):
    # Given T, which has used a lot already, and S, which spreads its backlog over ten keys,
    s, _ = tenants(capacity=8, allocation_caps=caps)
    s.submit("t-old", "job", None, "T", cost=100.0)
    (old,) = s.schedule()
    s.complete(old.uid, 1.0)
    for k in range(10):
        backlog(s, f"S/{k}", 3)
    backlog(s, "T", 8)
    started = [a.fairness_key for a in s.schedule()]
    if not caps:  # fairness alone: S, far behind T, takes every slot
        assert started.count("T") == 0
        return
    # with allocation caps the tenants get 4 slots each, and S's 4 go to four of its keys,
    slots = s.allocation().slots
    assert slots["T"] == 4
    assert [slots[f"S/{k}"] for k in range(10)] == [1, 1, 1, 1, 0, 0, 0, 0, 0, 0]
    # so T runs its allocation though it has used more, and S's first four keys one each.
    assert started.count("T") == 4
    assert sorted(k for k in started if k != "T") == ["S/0", "S/1", "S/2", "S/3"]
    # The tenants got their weighted shares exactly; within S, four keys got 1 slot against
    # a share of 0.4 each: 2.4 slots beyond their shares.
    assert s.redistributed(slots) == pytest.approx(2.4)


def test_policies_split_into_the_tenants_and_the_keys():
    p = KeyPolicies.from_mapping(
        {"acme": {"weight": 2}, "acme/*": {"weight": 3}, "*/*": {"max_concurrency": 1}, "*": {}}
    )
    tenants_, keys = p.levels("/")
    assert tenants_.for_key("acme").weight == 2
    assert tenants_.for_key("other").weight == 1
    assert keys.for_key("acme/alice").weight == 3
    assert keys.for_key("bob/x").max_concurrency == 1


def test_a_tenants_rate_is_one_bucket_for_all_its_keys_and_its_slots_go_to_others():
    # Given tenant S at 2 a second with a burst of 2 over its ten keys, T unlimited, 4 slots,
    s, clock = tenants(capacity=4, keys={"S": {"rate": "2/s", "burst": 2}})
    for k in range(10):
        backlog(s, f"S/{k}", 2)
    backlog(s, "T", 10)
    assert s.key_rate("S/3") is None  # (its keys have no rate of their own)
    assert s.tenant_rate("S/3") == (2.0, 2.0, False)
    assert s.tenant_rate("T") is None
    # S starts its burst, two jobs of any of its keys, and T takes the slots S may not use;
    started = [a.fairness_key for a in s.schedule()]
    assert sorted(k for k in started if k.startswith("S")) == ["S/0", "S/1"]
    assert started.count("T") == 2
    # S is out of its rate whichever of its keys asks, until its bucket refills.
    assert s.next_rise() == pytest.approx(0.5)
    why = s.why("S/7#0")
    assert why is not None
    [rate] = [b for b in why.blockers if b.reason is BlockReason.RATE_LIMIT]
    assert (rate.key, rate.tenant, rate.refills_in) == ("S", True, pytest.approx(0.5))
    assert line(rate) == "rate limit of tenant 'S': refills in 0.5 s"
    assert BlockReason.KEY_CAP not in [b.reason for b in why.blockers]
    assert why_from_dict(why_to_dict(why)) == why
    for uid in [v.uid for v in s.snapshot().jobs if v.state.value == "running"]:
        s.complete(uid, 1.0)
    assert [a.fairness_key for a in s.schedule()] == ["T"] * 4
    clock.set(0.5)
    for uid in [v.uid for v in s.snapshot().jobs if v.state.value == "running"]:
        s.complete(uid, 1.0)
    assert next(a.fairness_key for a in s.schedule()).startswith("S/")  # one start's worth


def test_a_tenant_out_of_its_rate_is_read_last_whichever_of_its_keys():
    # Given tenant S at 2 a second over many keys, its key S/a at 1 a second, and T unlimited,
    s, clock = tenants(capacity=4, keys={"S": {"rate": "2/s", "burst": 2}, "S/a": {"rate": 1}})
    backlog(s, "S/a", 2)
    backlog(s, "S/b", 2)
    backlog(s, "T", 4)
    s.schedule()  # S/a and S/b start one each: S's bucket and S/a's are out
    assert s.read_cost("S/zzz") == s.read_cost("S/b") == float("inf")  # any of its keys
    assert s.read_cost("T") == s.tenant_cost("T") > 0
    clock.set(0.5)  # S refilled a start, S/a not yet: S/a out of its own rate, S/b not
    assert s.read_cost("S/a") == float("inf")
    assert s.read_cost("S/b") == s.tenant_cost("S") == s.order_cost("S/b")


def test_a_tenants_rate_and_its_keys_rates_both_hold():
    # S at 1/s (burst 3); its key S/a at 1/s (burst 1): S/a starts one, S/b the rest of S's 3.
    s, _ = tenants(capacity=8, keys={"S": {"rate": "1/s", "burst": 3}, "S/a": {"rate": "1/s"}})
    backlog(s, "S/a", 3)
    backlog(s, "S/b", 3)
    assert sorted(a.fairness_key for a in s.schedule()) == ["S/a", "S/b", "S/b"]


def test_a_tenants_rate_per_cost_and_from_the_fleet_and_a_start_undone_gives_it_back():
    s, clock = tenants(capacity=4, keys={"S": {"rate": "1/s", "per": "cost"}})
    s.submit("x", "job", None, "S/a", cost=3.0)
    s.submit("y", "job", None, "S/b", cost=1.0)
    assert refs(s.schedule()) == ["x"]
    assert s.next_rise() == pytest.approx(3.0)  # a debt of 2, and 1 more for a start
    s.revert("x")  # the store refused it: the start never happened
    assert s.next_rise() is None
    assert refs(s.schedule()) == ["x"]
    s.set_tenant_tokens("S", 1.0)  # the fleet's bucket: other workers used less
    assert refs(s.schedule()) == ["y"]
    s.set_tenant_tokens("S", -3.0)  # and now more
    s.set_tenant_tokens("nobody", -1.0)  # a tenant the core does not know: nothing to do
    s.submit("z", "job", None, "S/c")
    clock.set(3.9)
    assert s.schedule() == []
    clock.set(4.0)
    assert refs(s.schedule()) == ["z"]


def test_removing_a_tenants_rate_at_run_time_lets_it_run_at_once():
    s, _ = tenants(capacity=4, keys={"*": {"rate": "1/h"}})
    backlog(s, "S/a", 2)
    backlog(s, "T", 2)
    assert sorted(refs(s.schedule())) == ["S/a#0", "T#0"]
    # now only keys with the separator have a rate, each a bucket of its own, full: T (no
    # "/") has none, and S/a starts one more from its new bucket.
    s.set_key_policies(KeyPolicies.from_mapping({"*/*": {"rate": "1/h"}}))
    assert sorted(refs(s.schedule())) == ["S/a#1", "T#1"]
    assert s.tenant_rate("S/a") is None
    assert s.key_rate("S/a") == (1 / 3600, 1.0, False)


def test_an_urgent_job_passes_its_tenants_cap_but_not_its_tenants_rate():
    aging = Aging(interval=1.0, grace=0.0, urgent_threshold=9)
    s, clock = tenants(capacity=4, aging=aging, keys={"S": {"max_concurrency": 1}})
    backlog(s, "S/a", 2)
    assert refs(s.schedule()) == ["S/a#0"]
    clock.advance(60)  # S/a#1 is urgent by now: it passes its tenant's cap
    assert refs(s.schedule()) == ["S/a#1"]
    s, clock = tenants(capacity=4, aging=aging, keys={"S": {"rate": "1/h"}})
    backlog(s, "S/a", 2)
    assert refs(s.schedule()) == ["S/a#0"]
    clock.advance(60)
    assert s.schedule() == []
    assert s.why("S/a#1").blockers[0].reason is BlockReason.RATE_LIMIT


def test_a_tenant_refilled_at_its_cap_lets_its_urgent_job_pass_the_cap_at_once():
    aging = Aging(interval=1.0, grace=0.0, urgent_threshold=9)
    s, clock = tenants(capacity=4, aging=aging, keys={"S": {"max_concurrency": 1, "rate": "1/30s"}})
    backlog(s, "S/a", 2)
    assert refs(s.schedule()) == ["S/a#0"]  # S at its cap, and out of its rate
    clock.advance(20)  # S/a#1 is urgent, but S's bucket is still short
    assert s.schedule() == []
    clock.set(s.next_rise())  # refilled, still at its cap: the urgent job passes the cap
    assert clock.now() == pytest.approx(30.0)
    assert refs(s.schedule()) == ["S/a#1"]


def test_the_engine_asks_the_store_with_each_keys_tenant_and_its_terms():
    s, _ = tenants(keys={"acme": {"weight": 2, "max_concurrency": 3}})
    assert s.tenant_terms("acme/alice") == ("acme", 3, 2.0)
    assert s.tenant_terms("solo") == ("solo", None, 1.0)
    flat, _ = make(1, [JOB])
    assert flat.tenant_terms("acme/alice") is None


def test_a_first_waiter_whose_key_other_workers_cap_gives_way_to_the_next():
    # Tenant T has used more than S; S/b and T/x wait for repository linux, which S/a holds,
    s, _ = tenants(capacity=3, keys={"S/b": {"max_concurrency": 1}})
    s.submit("t0", "job", None, "T/y", cost=5.0)
    assert refs(s.schedule()) == ["t0"]
    s.complete("t0", 1.0)
    s.submit("holder", "clone", "linux", "S/a", cost=1.0)
    assert refs(s.schedule()) == ["holder"]
    s.submit("sb", "clone", "linux", "S/b")
    s.submit("tx", "clone", "linux", "T/x")
    # so when S/a is done, the repository goes to S (the tenant that has used less): S/b is
    # its first waiter; then other workers run S/b's cap: T/x comes first, and starts.
    s.complete("holder", 1.0)
    s.set_running_elsewhere({}, {}, {"S/b": 1})
    assert refs(s.schedule()) == ["tx"]


def test_the_first_waiter_changes_within_a_tenant_when_the_store_raises_its_keys_cost():
    s, _ = tenants(capacity=3)
    s.submit("holder", "clone", "linux", "T/h")
    assert refs(s.schedule()) == ["holder"]
    s.submit("sb", "clone", "linux", "S/b")
    s.submit("sc", "clone", "linux", "S/c")
    s.complete("holder", 1.0)  # the repository's first waiter: S/b, first of S's equal keys
    s.set_accumulated("S/b", 10.0)  # the fleet says S/b has used more: S/c goes first
    assert refs(s.schedule())[0] == "sc"


def test_why_names_the_tenants_cap_when_the_tenant_holds_a_key_back():
    from celery_fair.core.inspect import CapFull

    s, _ = tenants(capacity=4, keys={"S": {"max_concurrency": 2}})
    for k in range(3):
        backlog(s, f"S/{k}", 1)
    assert len(s.schedule()) == 2
    why = s.why("S/2#0")
    assert why is not None
    [cap] = [b for b in why.blockers if isinstance(b, CapFull)]
    assert (cap.reason, cap.name, cap.running, cap.limit) == (BlockReason.TENANT_CAP, "S", 2, 2)
    assert line(cap) == "tenant cap 'S' 2/2"
    assert why_from_dict(why_to_dict(why)) == why  # and a worker's reply reads back
    # a key at its own cap inside a tenant at its cap is held back by both
    s, _ = tenants(capacity=4, keys={"S": {"max_concurrency": 1}, "S/*": {"max_concurrency": 1}})
    backlog(s, "S/a", 2)
    assert len(s.schedule()) == 1
    why = s.why("S/a#1")
    assert [b.reason for b in why.blockers] == [BlockReason.KEY_CAP, BlockReason.TENANT_CAP]


@pytest.mark.parametrize("how", ["reprioritize", "cancel"])
def test_the_last_waiter_of_a_free_conflict_leaving_a_capped_tenant_leaves_no_conflict(how):
    # Given tenant a capped at 0, and a/x's job parked on a conflict another tenant's job held,
    s, _ = tenants(capacity=2, keys={"a": {"max_concurrency": 0}})
    s.submit("held", "clone", "r1", "solo")
    assert refs(s.schedule()) == ["held"]
    s.submit("waits", "clone", "r1", "a/x")
    # once the conflict is free (its waiter may not run: its tenant may run nothing),
    s.release("held")
    assert list(s._conflicts) == [("git", "r1")]
    # the waiter leaving takes the conflict's record with it (no tenant queue, no lane left).
    if how == "reprioritize":
        s.reprioritize("waits", 4)
    else:
        s.cancel("waits")
    assert s._conflicts == {}


def test_pausing_a_tenant_holds_all_its_keys_and_its_slots_go_to_others():
    s, _ = tenants(capacity=2)
    s.pause_tenant("S")  # before it appears: paused when it does
    backlog(s, "S/a", 2)
    backlog(s, "S/b", 2)
    backlog(s, "T", 3)
    assert sorted(refs(s.schedule())) == ["T#0", "T#1"]
    why = s.why("S/b#0")
    assert why is not None
    assert [line(b) for b in why.blockers if b.reason is BlockReason.PAUSED] == [
        "paused (tenant 'S')"
    ]
    assert why_from_dict(why_to_dict(why)) == why
    assert s.blocked_counts()["paused"] == 4
    assert s.paused_tenants == frozenset({"S"})
    assert s.paused == (frozenset(), frozenset())  # no key of its own is paused
    s.complete("T#0", 1.0)
    assert refs(s.schedule()) == ["T#2"]
    s.resume_tenant("S")
    s.complete("T#1", 1.0)
    assert refs(s.schedule())[0].startswith("S/")


def test_a_paused_tenants_jobs_do_not_age_while_it_is_paused():
    aging = Aging(interval=1.0, grace=0.0)
    s, clock = tenants(capacity=1, aging=aging)
    s.submit("s", "job", None, "S/a")
    s.pause_tenant("S")
    clock.set(10.0)
    s.resume_tenant("S")
    clock.set(12.0)
    view = s.status("s")
    assert view is not None
    assert view.effective_priority == 1 + 2  # two seconds of waiting, not twelve
    assert s.next_rise() == pytest.approx(13.0)


def test_pausing_a_tenant_with_flat_keys_pauses_nothing():
    s, _ = make(1, [JOB])
    s.pause_tenant("S")
    s.submit("x", "job", None, "S")
    assert refs(s.schedule()) == ["x"]
