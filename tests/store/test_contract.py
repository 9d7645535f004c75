"""One behavioural suite for both stores: every shared rule holds the same way in each."""

from __future__ import annotations

import math
import time

from harness import wait_until

from celery_fair.core import CostLifecycle
from celery_fair.store import (
    Ask,
    Done,
    QueuedCount,
    Running,
    Submission,
    Verdict,
    conflict_field,
    estimate_field,
)
from celery_fair.store.wire import first_token

NEVER = CostLifecycle.never()


def ask(
    uid: str,
    key: str = "k",
    *,
    type: str = "clone",
    priority: int = 8,
    tier_cap: int | None = None,
    type_cap: int | None = None,
    group: str = "git",
    job_id: str | None = None,
    cost: float | None = None,
    default_cost: float = 1.0,
    key_cap: int | None = None,
    weight: float = 1.0,
    claim: float | None = None,
    rate: float | None = None,
    burst: float = 1.0,
    per_cost: bool = False,
    type_rate: float | None = None,
    type_burst: float = 1.0,
    type_per_cost: bool = False,
    tenant: str | None = None,
    tenant_weight: float = 1.0,
    tenant_cap: int | None = None,
    tenant_rate: float | None = None,
    tenant_burst: float = 1.0,
    tenant_per_cost: bool = False,
) -> Ask:
    return Ask(
        uid,
        type,
        priority,
        tier_cap,
        type_cap,
        conflict_field(group, job_id),
        estimate_field(type, job_id),
        key,
        cost,
        default_cost,
        key_cap,
        weight,
        claim,
        rate,
        burst,
        per_cost,
        type_rate,
        type_burst,
        type_per_cost,
        tenant,
        tenant_weight,
        tenant_cap,
        tenant_rate,
        tenant_burst,
        tenant_per_cost,
    )


def verdicts(reply) -> list[Verdict]:
    return [g.verdict for g in reply.grants]


def test_a_full_tier_refuses_and_a_blocked_job_does_not_stop_the_ones_after_it(make_store):
    store = make_store(lifecycle=NEVER)
    reply = store.admit(
        "w1",
        [
            ask("a", tier_cap=2),
            ask("b", tier_cap=2),
            ask("c", tier_cap=2),  # the tier is full
            ask("d", type="pull", priority=4, tier_cap=1),  # another tier still has room
        ],
    )
    assert verdicts(reply) == [
        Verdict.ADMITTED,
        Verdict.ADMITTED,
        Verdict.TIER_CAP,
        Verdict.ADMITTED,
    ]
    assert reply.tiers == {8: 2, 4: 1}
    assert reply.types == {"clone": 2, "pull": 1}


def test_caps_count_every_worker(make_store):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    [a] = one.admit("w1", [ask("a", type_cap=1)]).grants
    assert a.verdict is Verdict.ADMITTED
    assert verdicts(two.admit("w2", [ask("b", type_cap=1)])) == [Verdict.TYPE_CAP]
    [done] = one.finish("w1", [Done("a", a.token, None)])
    assert done.applied
    assert verdicts(two.admit("w2", [ask("b", type_cap=1)])) == [Verdict.ADMITTED]


def test_conflicts_exclude_the_same_job_id_in_the_same_group_only(make_store):
    store = make_store(lifecycle=NEVER)
    reply = store.admit(
        "w1",
        [
            ask("a", job_id="linux"),
            ask("b", job_id="linux"),  # same group, same id
            ask("c", job_id="git"),  # same group, other id
            ask("d", group="", job_id="linux"),  # no group
            ask("e", group="other", job_id="linux"),  # other group
            ask("f", job_id=None),  # no job_id
        ],
    )
    assert verdicts(reply) == [Verdict.ADMITTED, Verdict.CONFLICT] + [Verdict.ADMITTED] * 4
    token = reply.grants[0].token
    store.finish("w1", [Done("a", token, 1.0)])
    assert verdicts(store.admit("w1", [ask("b", job_id="linux")])) == [Verdict.ADMITTED]


def test_a_new_store_hands_out_tokens_above_its_creation_time(make_store):
    # So a store that comes back empty (a Redis restarted without persistence, a worker
    # restarted alone on the in-memory store) never hands out a token below an earlier one.
    before = first_token(time.time() - 1)
    [a] = make_store(lifecycle=NEVER).admit("w1", [ask("a")]).grants
    assert before < a.token < first_token(time.time() + 1)


def test_tokens_increase_and_a_redelivered_running_job_is_not_admitted_twice(make_store):
    store = make_store(lifecycle=NEVER)
    first = store.admit("w1", [ask("a"), ask("b")])
    again = store.admit("w2", [ask("a"), ask("c")])
    tokens = [g.token for g in first.grants] + [again.grants[1].token]
    assert tokens == sorted(tokens)
    assert len(set(tokens)) == 3
    assert again.grants[0].verdict is Verdict.RUNNING
    assert again.tiers == {8: 3}


def test_admission_charges_the_estimate_and_a_given_cost_overrides_it(make_store):
    store = make_store(lifecycle=NEVER)
    reply = store.admit("w1", [ask("a", "alice", default_cost=2.5), ask("b", "alice", cost=4.0)])
    assert [(g.estimate, g.accumulated) for g in reply.grants] == [(2.5, 2.5), (4.0, 6.5)]
    assert store.accumulated_cost("alice") == 6.5
    assert store.accumulated_cost("nobody") == 0.0
    # A refused job reports the key's current cost and charges nothing.
    refused = store.admit("w1", [ask("c", "alice", type_cap=1)])
    assert refused.grants[0].accumulated == 6.5


def test_completion_learns_the_estimate_with_the_exact_rule(make_store):
    store = make_store(alpha=0.3, lifecycle=NEVER)
    expected = 1.0
    token = 0
    for i, elapsed in enumerate([5.0, 0.1, 7.3, 1e-9, 123.456]):
        [grant] = store.admit("w1", [ask(f"j{i}", job_id="linux")]).grants
        assert grant.estimate == expected
        token = grant.token
        [done] = store.finish("w1", [Done(f"j{i}", token, elapsed)])
        expected = 0.3 * elapsed + (1 - 0.3) * expected
        assert done.estimate == expected  # bit for bit, not approximately
    assert store.estimate("clone", "linux", 1.0) == expected
    assert store.estimate("clone", None, 1.0) == 1.0  # per (type, job_id)


def test_release_without_elapsed_frees_without_learning(make_store):
    store = make_store(lifecycle=NEVER)
    [grant] = store.admit("w1", [ask("a", job_id="linux", type_cap=1)]).grants
    [done] = store.finish("w1", [Done("a", grant.token, None)])
    assert done.applied
    assert done.estimate == 1.0
    assert store.estimate("clone", "linux", 1.0) == 1.0
    assert verdicts(store.admit("w1", [ask("b", job_id="linux", type_cap=1)])) == [Verdict.ADMITTED]


def test_a_stale_token_changes_nothing(make_store):
    store = make_store(lifecycle=NEVER)
    [grant] = store.admit("w1", [ask("a", job_id="linux")]).grants
    [stale] = store.finish("w1", [Done("a", grant.token + 1, 9.0)])
    assert not stale.applied
    assert verdicts(store.admit("w1", [ask("b", job_id="linux")])) == [Verdict.CONFLICT]
    [ok, twice] = store.finish("w1", [Done("a", grant.token, 2.0), Done("a", grant.token, 2.0)])
    assert ok.applied
    assert not twice.applied
    assert store.estimate("clone", "linux", 1.0) == 0.3 * 2.0 + (1 - 0.3) * 1.0


def test_a_dead_workers_jobs_are_reclaimed_after_its_lease_and_its_late_finish_is_stale(make_store):
    # (a lease long enough that the second admit surely comes before it ends, on a loaded host
    # too: with 0.5 s, a run beside three others once saw the lease end in between)
    dead, alive = make_store(lease=3.0, lifecycle=NEVER), make_store(lease=3.0, lifecycle=NEVER)
    [grant] = dead.admit("dead", [ask("a", job_id="linux", type_cap=1)]).grants
    assert verdicts(alive.admit("alive", [ask("b", job_id="linux")])) == [Verdict.CONFLICT]

    def reclaimed():
        view = alive.heartbeat("alive", [conflict_field("git", "linux")], [])
        return view if not view.held[conflict_field("git", "linux")] else None

    view = wait_until(reclaimed, 20, "the dead worker's lease to expire")
    assert view.types == {}
    [grant_b] = alive.admit("alive", [ask("b", job_id="linux", type_cap=1)]).grants
    assert grant_b.verdict is Verdict.ADMITTED
    # The dead worker wakes up and reports its job: nothing changes, b keeps its conflict.
    [late] = dead.finish("dead", [Done("a", grant.token, 50.0)])
    assert not late.applied
    assert store_estimate_untouched(alive)
    assert verdicts(alive.admit("alive", [ask("c", job_id="linux")])) == [Verdict.CONFLICT]


def store_estimate_untouched(store) -> bool:
    return store.estimate("clone", "linux", 1.0) == 1.0


def test_a_worker_that_keeps_beating_keeps_its_jobs(make_store):
    store = make_store(lease=0.6, lifecycle=NEVER)
    other = make_store(lease=0.6, lifecycle=NEVER)
    store.admit("w1", [ask("a", job_id="linux")])
    beats = 0

    def beaten_for_two_leases():
        nonlocal beats
        view = store.heartbeat("w1", [], [])
        assert view.mine == 1
        beats += 1
        other.heartbeat("w2", [], [])  # reclaims whatever has expired
        return beats >= 12

    wait_until(beaten_for_two_leases, 10, "heartbeats over two leases", every=0.1)
    assert verdicts(other.admit("w2", [ask("b", job_id="linux")])) == [Verdict.CONFLICT]


def test_heartbeat_reads_counts_conflicts_and_costs(make_store):
    store = make_store(lifecycle=NEVER)
    store.admit("w1", [ask("a", "alice", job_id="linux", cost=3.0)])
    view = store.heartbeat(
        "w1", [conflict_field("git", "linux"), conflict_field("git", "git")], ["alice", "bob"]
    )
    assert view.mine == 1
    assert view.reclaimed == 0
    assert view.tiers == {8: 1}
    assert view.types == {"clone": 1}
    assert view.held == {conflict_field("git", "linux"): True, conflict_field("git", "git"): False}
    assert view.accumulated == {"alice": 3.0, "bob": 0.0}
    assert math.isfinite(view.now)


def test_register_puts_back_only_what_the_store_forgot(make_store):
    store = make_store(lifecycle=NEVER)
    [grant] = store.admit("w1", [ask("a", job_id="linux")]).grants
    jobs = [
        Running("a", grant.token, "clone", 8, conflict_field("git", "linux"),
                estimate_field("clone", "linux"), "k", 1.0, 1.0),
        Running("z", 99, "clone", 8, conflict_field("git", "git"),
                estimate_field("clone", "git"), "k", 1.0, 1.0),
    ]  # fmt: skip
    assert store.register("w1", jobs) == (1, 0)
    view = store.heartbeat("w1", [conflict_field("git", "git")], [])
    assert view.mine == 2
    assert view.tiers == {8: 2}
    assert view.held[conflict_field("git", "git")]
    # The registered token stays valid and later tokens are larger.
    assert store.finish("w1", [Done("z", 99, None)])[0].applied
    assert store.admit("w1", [ask("b")]).grants[0].token > 99


def test_register_with_a_keep_list_releases_what_the_worker_does_not_have(make_store):
    # Given w1 runs a (conflict linux) and b; c ended and its end is not reported yet; d ended
    # and the store never heard (its release was lost); w2 runs e,
    store = make_store(lifecycle=NEVER)
    grants = store.admit(
        "w1",
        [ask("a", job_id="linux"), ask("b", job_id="b"), ask("c", job_id="c"),
         ask("d", job_id="linux2")],
    ).grants  # fmt: skip
    [e] = store.admit("w2", [ask("e", job_id="e")]).grants
    a, b = grants[0], grants[1]
    running = [
        Running(uid, g.token, "clone", 8, conflict_field("git", job), estimate_field("clone", job),
                "k", 1.0, 1.0)
        for uid, g, job in (("a", a, "linux"), ("b", b, "b"))
    ]  # fmt: skip
    # when w1 registers all it has: a and b running, c ended,
    assert store.register("w1", running, keep=["c"]) == (0, 1)
    # then only d is released: its slot and its conflict come back,
    view = store.heartbeat(
        "w1", [conflict_field("git", "linux2"), conflict_field("git", "linux")], []
    )
    assert view.mine == 3
    assert view.tiers == {8: 4}
    assert view.held == {
        conflict_field("git", "linux2"): False,
        conflict_field("git", "linux"): True,
    }
    # c's late report still applies, and w2's job was not touched.
    assert store.finish("w1", [Done("c", grants[2].token, None)])[0].applied
    assert store.finish("w2", [Done("e", e.token, None)])[0].applied


def test_idle_keys_and_unused_estimates_expire(make_store):
    store = make_store(lifecycle=CostLifecycle(cost_ttl=0.3, estimate_ttl=0.3))
    [a, _b] = store.admit("w1", [ask("a", "gone", job_id="x"), ask("b", "busy")]).grants
    store.finish("w1", [Done("a", a.token, 2.0)])  # "gone" is idle now; "busy" still runs
    assert store.accumulated_cost("gone") == 1.0
    assert store.estimate("clone", "x", 1.0) != 1.0

    def expired():
        store.heartbeat("w1", [], [])
        return store.accumulated_cost("gone") == 0.0 and store.estimate("clone", "x", 1.0) == 1.0

    wait_until(expired, 10, "the idle key and the estimate to expire")
    assert store.accumulated_cost("busy") == 1.0  # a key with a running job is never evicted


def test_periodic_reset_zeroes_every_accumulated_cost(make_store):
    store = make_store(lifecycle=CostLifecycle(cost_ttl=None, reset_interval=0.3))
    store.admit("w1", [ask("a", "alice", cost=5.0), ask("b", "bob", cost=2.0)])

    def reset():
        store.heartbeat("w1", [], [])
        return store.accumulated_cost("alice") == 0.0 and store.accumulated_cost("bob") == 0.0

    wait_until(reset, 10, "the periodic reset")


def test_advance_idle_raises_a_returning_key_to_the_least_active_cost(make_store):
    store = make_store(lifecycle=CostLifecycle(cost_ttl=None, advance_idle=True))
    store.admit("w1", [ask("a", "alice", cost=5.0), ask("b", "bob", cost=8.0)])
    [new] = store.admit("w1", [ask("c", "carol", cost=1.0)]).grants
    assert new.accumulated == 5.0 + 1.0  # starts from alice's 5, the least among active keys
    [again] = store.admit("w1", [ask("d", "carol", cost=1.0)]).grants
    assert again.accumulated == 7.0  # carol is active now: charged normally


def test_a_job_given_back_unstarted_refunds_its_charge_and_teaches_nothing(make_store):
    store = make_store(lifecycle=NEVER)
    store.admit("w1", [ask("a", "alice", job_id="linux", cost=2.0)])
    [b] = store.admit("w1", [ask("b", "alice", job_id="rust")]).grants
    assert b.accumulated == 3.0
    # given back unstarted: alice pays for a only, and nothing is learned or remembered
    [done] = store.finish("w1", [Done("b", b.token, None, unstarted=True)])
    assert done.applied
    assert store.accumulated_cost("alice") == 2.0
    assert store.estimate("clone", "rust", 1.0) == 1.0
    [again] = store.admit("w1", [ask("b", "alice", job_id="rust")]).grants
    assert (again.verdict, again.accumulated) == (Verdict.ADMITTED, 3.0)
    assert again.token > b.token
    # a stale give-back refunds nothing
    [stale] = store.finish("w1", [Done("b", b.token, None, unstarted=True)])
    assert not stale.applied
    assert store.accumulated_cost("alice") == 3.0


def test_a_refund_moves_the_least_active_cost_with_it(make_store):
    store = make_store(lifecycle=CostLifecycle(cost_ttl=None, advance_idle=True))
    store.admit("w1", [ask("a", "alice", cost=5.0), ask("b", "bob", cost=8.0)])
    [a2] = store.admit("w1", [ask("a2", "alice", cost=4.0)]).grants  # alice 9: bob 8 least
    store.finish("w1", [Done("a2", a2.token, None, unstarted=True)])  # alice back to 5
    [new] = store.admit("w1", [ask("c", "carol", cost=1.0)]).grants
    assert new.accumulated == 5.0 + 1.0


# -- one round trip for the whole exchange ------------------------------------------------------


def test_one_call_releases_what_finished_before_it_admits_anything(make_store):
    store = make_store(lifecycle=NEVER)
    [a] = store.admit("w1", [ask("a", tier_cap=1)]).grants
    reply = store.admit("w1", [ask("b", tier_cap=1)], done=[Done("a", a.token, 2.0)])
    assert [f.applied for f in reply.finished] == [True]
    assert reply.finished[0].estimate == 0.3 * 2.0 + 0.7 * 1.0
    assert verdicts(reply) == [Verdict.ADMITTED]
    assert reply.tiers == {8: 1}


def test_watched_conflicts_and_live_workers_are_reported(make_store):
    store = make_store(lifecycle=NEVER)
    store.admit("w1", [ask("a", job_id="linux")])
    reply = store.admit(
        "w2", [], watch=[conflict_field("git", "linux"), conflict_field("git", "redis")]
    )
    assert reply.held == {
        conflict_field("git", "linux"): True,
        conflict_field("git", "redis"): False,
    }
    assert reply.workers == 2
    assert store.heartbeat("w3", [], []).workers == 3


def test_a_late_copy_of_a_job_that_finished_for_good_is_answered_done_for_a_while(make_store):
    store = make_store(lifecycle=NEVER, dedupe=0.5)
    [a] = store.admit("w1", [ask("a")]).grants
    [b] = store.admit("w1", [ask("b")]).grants
    # a's message was acknowledged (final); b was only released (its message may come back).
    store.finish("w1", [Done("a", a.token, 1.0, final=True), Done("b", b.token, None)])
    assert verdicts(store.admit("w2", [ask("a"), ask("b")])) == [Verdict.DONE, Verdict.ADMITTED]

    def admitted_again():
        [grant] = store.admit("w2", [ask("a")]).grants
        return grant.verdict is Verdict.ADMITTED

    wait_until(admitted_again, 10, "the tombstone of a to expire")


def test_a_copy_of_a_running_job_is_answered_running_whoever_asks(make_store):
    store = make_store(lifecycle=NEVER)
    store.admit("w1", [ask("a")])
    assert verdicts(store.admit("w2", [ask("a")])) == [Verdict.RUNNING]


def test_a_key_cap_counts_every_worker_and_the_reply_says_how_many_run(make_store):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    reply = one.admit("w1", [ask("a", "alice", key_cap=2), ask("b", "alice", key_cap=2)])
    assert verdicts(reply) == [Verdict.ADMITTED, Verdict.ADMITTED]
    assert reply.keys == {"alice": 2}
    a = reply.grants[0]
    reply = two.admit("w2", [ask("c", "alice", key_cap=2), ask("d", "bob", key_cap=2)])
    assert verdicts(reply) == [Verdict.KEY_CAP, Verdict.ADMITTED]
    assert reply.keys == {"alice": 2, "bob": 1}
    assert two.admit("w2", [ask("e", "carol")]).keys == {}  # asked without a cap
    view = two.heartbeat("w2", [], ["alice", "bob", "carol"])
    assert view.keys == {"alice": 2, "bob": 1, "carol": 1}
    one.finish("w1", [Done("a", a.token, None)])
    assert verdicts(two.admit("w2", [ask("c", "alice", key_cap=2)])) == [Verdict.ADMITTED]


def test_a_weight_divides_the_charge_and_a_refund_gives_back_that_charge(make_store):
    store = make_store(lifecycle=NEVER)
    [a] = store.admit("w1", [ask("a", "alice", cost=3.0, weight=4.0)]).grants
    assert (a.estimate, a.accumulated) == (3.0, 0.75)
    [b] = store.admit("w1", [ask("b", "alice", weight=4.0)]).grants
    assert (b.estimate, b.accumulated) == (1.0, 1.0)
    store.finish("w1", [Done("b", b.token, None, unstarted=True)])
    assert store.accumulated_cost("alice") == 0.75
    # the same estimate at weight 1 charges it whole, bit for bit as the core does
    [c] = store.admit("w1", [ask("c", "bob", cost=0.1)]).grants
    assert c.accumulated == 0.1


def test_runtime_policies_reach_a_heartbeat_once_per_version_and_pauses_refuse(make_store):
    store = make_store(lifecycle=NEVER)
    view = store.heartbeat("w1", [], [], -1)
    assert (view.policies, view.policy_doc) == (0, None)  # never set
    version, doc = store.update_policies(lambda old: ('{"v": 1}', ["acme"], ["rescan"], []))
    assert (version, doc) == (1, '{"v": 1}')
    assert store.policies() == (1, '{"v": 1}')
    view = store.heartbeat("w1", [], [], 0)
    assert (view.policies, view.policy_doc) == (1, '{"v": 1}')
    view = store.heartbeat("w1", [], [], 1)  # the caller has it: not sent again
    assert (view.policies, view.policy_doc) == (1, None)
    # Paused keys and types are refused by the store itself, whatever the worker knows.
    reply = store.admit("w1", [ask("a", "acme"), ask("b", type="rescan"), ask("c", "bob")])
    assert verdicts(reply) == [Verdict.PAUSED, Verdict.PAUSED, Verdict.ADMITTED]
    # The next change replaces the pauses: acme resumed, rescan still paused.
    seen = []

    def change(old):
        seen.append(old)
        return '{"v": 2}', [], ["rescan"], []

    assert store.update_policies(change) == (2, '{"v": 2}')
    assert seen == ['{"v": 1}']
    reply = store.admit("w1", [ask("d", "acme"), ask("e", type="rescan")])
    assert verdicts(reply) == [Verdict.ADMITTED, Verdict.PAUSED]


def test_an_urgent_job_refused_for_a_full_tier_holds_its_next_free_slot(make_store):
    busy, waiting = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    [a] = busy.admit("w1", [ask("a", priority=1, tier_cap=1)]).grants
    urgent = ask("u", priority=1, tier_cap=1, claim=30.0)
    assert verdicts(waiting.admit("w2", [urgent])) == [Verdict.TIER_CAP]
    # The worker that ran a releases it and asks for its next job in the same call: the
    # freed slot is the urgent job's, and every worker sees it taken.
    reply = busy.admit("w1", [ask("b", priority=1, tier_cap=1)], [Done("a", a.token, 1.0)])
    assert verdicts(reply) == [Verdict.TIER_CAP]
    assert reply.tiers == {1: 1}
    assert waiting.heartbeat("w2", [], []).tiers == {1: 1}
    reply = waiting.admit("w2", [urgent])
    assert verdicts(reply) == [Verdict.ADMITTED]
    assert reply.tiers == {1: 1}  # it runs; its claim is gone
    [done] = waiting.finish("w2", [Done("u", reply.grants[0].token, 1.0)])
    assert done.applied
    assert verdicts(busy.admit("w1", [ask("b", priority=1, tier_cap=1)])) == [Verdict.ADMITTED]


def test_a_type_cap_is_claimed_the_same_way_and_the_first_claim_stands(make_store):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    [a] = one.admit("w1", [ask("a", type_cap=1)]).grants
    first = ask("u1", type_cap=1, claim=30.0)
    second = ask("u2", type_cap=1, claim=30.0)
    assert verdicts(two.admit("w2", [first])) == [Verdict.TYPE_CAP]
    assert verdicts(one.admit("w1", [second], [Done("a", a.token, None)])) == [Verdict.TYPE_CAP]
    assert verdicts(two.admit("w2", [first])) == [Verdict.ADMITTED]


def test_a_claim_lapses_when_its_job_stops_asking(make_store):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    [a] = one.admit("w1", [ask("a", type_cap=1)]).grants
    assert verdicts(two.admit("w2", [ask("u", type_cap=1, claim=0.3)])) == [Verdict.TYPE_CAP]
    one.finish("w1", [Done("a", a.token, None)])
    assert one.heartbeat("w1", [], []).types == {"clone": 1}  # held for u

    def free():
        return one.heartbeat("w1", [], []).types == {}

    wait_until(free, 10, "the urgent job's claim to lapse")
    assert verdicts(one.admit("w1", [ask("b", type_cap=1)])) == [Verdict.ADMITTED]


def test_a_job_that_is_not_urgent_claims_nothing(make_store):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    [a] = one.admit("w1", [ask("a", tier_cap=1)]).grants
    assert verdicts(two.admit("w2", [ask("u", tier_cap=1)])) == [Verdict.TIER_CAP]
    reply = one.admit("w1", [ask("b", tier_cap=1)], [Done("a", a.token, None)])
    assert verdicts(reply) == [Verdict.ADMITTED]


def test_a_submission_is_recorded_once_per_key_until_its_time_is_up(make_store):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    assert one.claim_submission("alice", "order-17", "t1", 30.0) is None
    assert two.claim_submission("alice", "order-17", "t2", 30.0) == Submission("t1", False)
    assert one.confirm_submission("alice", "order-17", "t1", 30.0)
    assert two.claim_submission("alice", "order-17", "t2", 30.0) == Submission("t1", True)
    assert two.claim_submission("bob", "order-17", "t3", 30.0) is None  # per fairness key
    # (the key and the idempotency key cannot run into each other)
    assert two.claim_submission("alice:", "order-17", "t4", 30.0) is None
    assert one.claim_submission("a", "short", "t5", 30.0) is None
    assert one.confirm_submission("a", "short", "t5", 0.2)
    wait_until(
        lambda: two.claim_submission("a", "short", "t6", 30.0) is None,
        10,
        "the short record to lapse",
    )
    assert one.claim_submission("a", "short", "t7", 30.0) == Submission("t6", False)


def test_a_pending_submission_is_dropped_only_by_its_own_producer_or_lapses(make_store):
    store = make_store(lifecycle=NEVER)
    assert store.claim_submission("alice", "k", "t1", 30.0) is None
    store.forget_submission("alice", "k", "other")  # not its record: it stays
    assert store.claim_submission("alice", "k", "t2", 30.0) == Submission("t1", False)
    store.forget_submission("alice", "k", "t1")  # its publish failed: the next claim wins
    assert store.claim_submission("alice", "k", "t2", 30.0) is None
    assert store.confirm_submission("alice", "k", "t2", 30.0)
    store.forget_submission("alice", "k", "t2")  # a published record is never dropped
    assert store.claim_submission("alice", "k", "t3", 30.0) == Submission("t2", True)
    # A pending record whose producer died lapses; its producer, confirming late, is told so
    # and records its publish only where nobody else's is.
    assert store.claim_submission("bob", "k", "b1", 0.2) is None
    wait_until(lambda: store.claim_submission("bob", "k", "b2", 30.0) is None, 10, "a lapse")
    assert not store.confirm_submission("bob", "k", "b1", 30.0)
    assert store.claim_submission("bob", "k", "b3", 30.0) == Submission("b1", True)
    assert store.confirm_submission("bob", "k", "b2", 30.0)  # its own; the first one stays
    assert store.claim_submission("bob", "k", "b3", 30.0) == Submission("b1", True)


def test_tracked_submissions_count_per_key_and_in_all_in_order(make_store):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)  # two producers
    assert one.track("alice", "a1") == QueuedCount(True, 0, 0)
    assert two.track("bob", "b1") == QueuedCount(True, 0, 1)
    assert one.track("alice", "a2") == QueuedCount(True, 1, 2)
    assert two.track("alice", "a1") == QueuedCount(False, 2, 3)  # already tracked: once
    # (keys that are prefixes of one another, or hold the separators, stay apart)
    assert one.track("alice|0", "x1").in_key == 0
    assert one.track("alic", "x2").in_key == 0
    assert one.track("ålice", "x3").in_key == 0
    found = two.queued("a2")
    assert found is not None
    assert (found.fairness_key, found.place_in_key, found.in_key) == ("alice", 2, 2)
    assert (found.place, found.total) == (3, 6)
    assert two.queued("x3").fairness_key == "ålice"
    assert one.queued("nobody") is None
    # Ending forgets; the places behind move up.
    assert two.untrack(["a1", "b1", "nobody"]) == 2
    assert two.untrack([]) == 0
    found = one.queued("a2")
    assert (found.place_in_key, found.in_key, found.place, found.total) == (1, 1, 1, 4)
    assert one.queued("a1") is None


def wait_lapsed(store, task_id, *, seconds, tracking):
    """Track new submissions of key ``tracking``, kept ``seconds`` (each track lets older
    entries lapse), until ``task_id``'s entry has lapsed."""
    wait_until(
        lambda: (
            store.track(tracking, f"{tracking}{time.monotonic()}", seconds=seconds).added
            and store.queued(task_id) is None
        ),
        10,
        f"{task_id}'s entry to lapse",
    )


def test_a_keys_rate_of_ends_is_known_a_second_after_its_first_and_lapses_are_no_ends(
    make_store,
):
    store = make_store(lifecycle=NEVER)
    for i in range(5):
        assert store.track("alice", f"a{i}").added
    assert store.track("bob", "lost", seconds=3600).added
    store.untrack(["a0"])
    store.untrack(["a1", "a2"])
    assert store.queued("a4").rate == 0.0  # not within a second of the first end
    found = wait_until(lambda: store.queued("a4").rate, 10, "a second of ends", every=0.05)
    assert 0 < found <= 2.0  # two ends after the first, a second or more after it
    assert store.queued("lost").rate == 0.0  # bob: nothing ended
    # A withdrawn entry (its publish failed) is not an end,
    assert store.track("alice", "never").added
    assert store.untrack(["never"], ended=False) == 1
    assert store.queued("never") is None
    assert store.track("dave", "d0").added
    assert store.untrack(["d1"], ended=False) == 0
    assert store.track("dave", "d1").added
    assert store.untrack(["d1"], ended=False) == 1
    assert store.queued("d0").rate == 0.0  # dave: nothing ended
    # nor is an entry that lapses: bob's rate stays unknown.
    wait_lapsed(store, "lost", seconds=0.3, tracking="carol")
    assert store.track("bob", "b1").added
    assert store.queued("b1").rate == 0.0


def test_tracking_refuses_past_a_limit_and_records_nothing(make_store):
    store = make_store(lifecycle=NEVER)
    for i in range(3):
        assert store.track("alice", f"a{i}", key_limit=3).added
    assert store.track("alice", "a3", key_limit=3) == QueuedCount(False, 3, 3, "key")
    assert store.queued("a3") is None
    assert store.track("bob", "b0", key_limit=3, total_limit=4).added  # another key: room
    assert store.track("cid", "c0", key_limit=3, total_limit=4) == QueuedCount(False, 0, 4, "total")
    store.untrack(["a0"])
    assert store.track("alice", "a3", key_limit=3).added


def test_a_tracked_submission_whose_end_is_never_reported_lapses(make_store):
    store = make_store(lifecycle=NEVER)
    assert store.track("alice", "lost", seconds=0.2).added
    wait_lapsed(store, "lost", seconds=0.2, tracking="bob")


def test_the_holder_of_a_conflict_is_named_with_its_worker_and_since_when(make_store):
    w1, w2 = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    field = conflict_field("git", "linux")
    assert w2.holder(field) is None
    reply = w1.admit("w1", [ask("u1", job_id="linux")])
    assert reply.grants[0].verdict is Verdict.ADMITTED
    found = w2.holder(field)
    assert (found.uid, found.worker) == ("u1", "w1")
    assert found.held_for is not None
    assert 0 <= found.held_for < 5
    wait_until(lambda: w2.holder(field).held_for >= 0.2, 10, "time to pass")
    w1.finish("w1", [Done("u1", reply.grants[0].token, 0.3, final=True)])
    assert w2.holder(field) is None


def test_tracked_submissions_are_listed_oldest_first_by_key_or_in_all_with_their_count(
    make_store,
):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)  # two producers
    # (ids in the order tracked: two tracked within one tick of the clock go by their id)
    for task_id, key in [("t1", "alice"), ("t2", "bob"), ("t3", "alice"), ("t4", "alice|0")]:
        assert one.track(key, task_id).added
    found, n = two.tracked("alice")
    assert ([t.task_id for t in found], n) == (["t1", "t3"], 2)
    assert {t.fairness_key for t in found} == {"alice"}  # not alice|0, whose name starts so
    assert found[0].at <= found[1].at
    found, n = two.tracked(None, limit=3)
    assert ([t.task_id for t in found], n) == (["t1", "t2", "t3"], 4)
    assert [t.fairness_key for t in found] == ["alice", "bob", "alice"]
    assert two.tracked("alice", limit=0) == ([], 2)
    assert two.tracked(None, limit=0) == ([], 4)
    assert two.tracked("nobody") == ([], 0)
    two.untrack(["t1"])
    assert [t.task_id for t in one.tracked("alice")[0]] == ["t3"]


HOURLY = 1 / 3600  # a rate that refills nothing a test could see


def test_a_keys_rate_counts_every_workers_starts_and_says_what_its_bucket_holds(make_store):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    limited = {"rate": HOURLY, "burst": 2.0}
    reply = one.admit("w1", [ask("a", "alice", **limited), ask("b", "alice", **limited)])
    assert verdicts(reply) == [Verdict.ADMITTED, Verdict.ADMITTED]
    assert [round(g.tokens, 3) for g in reply.grants] == [1.0, 0.0]
    # another worker finds the bucket spent; another key, and a key asked without a rate, run
    reply = two.admit("w2", [ask("c", "alice", **limited), ask("d", "bob", **limited), ask("e")])
    assert verdicts(reply) == [Verdict.RATE_LIMIT, Verdict.ADMITTED, Verdict.ADMITTED]
    assert round(reply.grants[0].tokens, 3) == 0.0
    assert round(reply.grants[1].tokens, 3) == 1.0
    assert reply.grants[2].tokens is None
    assert reply.grants[0].accumulated == 2.0  # a refused start charges nothing


def test_per_cost_charges_the_bucket_the_estimate_and_may_leave_a_debt(make_store):
    store = make_store(lifecycle=NEVER)
    by_cost = {"rate": HOURLY, "burst": 5.0, "per_cost": True}
    reply = store.admit("w1", [ask(f"j{i}", "alice", cost=3.0, **by_cost) for i in range(3)])
    assert verdicts(reply) == [Verdict.ADMITTED, Verdict.ADMITTED, Verdict.RATE_LIMIT]
    assert [round(g.tokens, 3) for g in reply.grants] == [2.0, -1.0, -1.0]


def test_a_spent_bucket_refills_at_its_rate_and_a_start_given_back_refunds_it(make_store):
    store = make_store(lifecycle=NEVER)
    fast = {"rate": 5.0, "burst": 1.0}
    reply = store.admit("w1", [ask("a", "alice", **fast), ask("b", "alice", **fast)])
    assert verdicts(reply) == [Verdict.ADMITTED, Verdict.RATE_LIMIT]  # one call: one moment
    a = reply.grants[0]
    # a fifth of a second later the bucket holds a start again
    wait_until(
        lambda: verdicts(store.admit("w1", [ask("b", "alice", **fast)])) == [Verdict.ADMITTED],
        10,
        "b admitted once the bucket refilled",
    )
    slow = {"rate": HOURLY, "burst": 1.0}
    [c] = store.admit("w1", [ask("c", "carol", **slow)]).grants
    assert verdicts(store.admit("w1", [ask("d", "carol", **slow)])) == [Verdict.RATE_LIMIT]
    store.finish("w1", [Done("c", c.token, None, unstarted=True)])  # it never ran
    assert verdicts(store.admit("w1", [ask("d", "carol", **slow)])) == [Verdict.ADMITTED]
    assert a.token


def test_a_keys_bucket_is_forgotten_with_its_cost(make_store):
    store = make_store(lifecycle=CostLifecycle(cost_ttl=0.2, estimate_ttl=None))
    slow = {"rate": HOURLY, "burst": 1.0}
    [a] = store.admit("w1", [ask("a", "alice", **slow)]).grants
    store.finish("w1", [Done("a", a.token, 0.1)])
    # idle past its TTL, alice is a new key: full bucket (nothing remembers her starts)
    wait_until(
        lambda: verdicts(store.admit("w1", [ask("b", "alice", **slow)])) == [Verdict.ADMITTED],
        10,
        "alice forgotten",
    )


def test_a_types_rate_counts_every_keys_starts_on_every_worker(make_store):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    export = {"type": "export", "type_rate": HOURLY, "type_burst": 2.0}
    # two keys' exports on one worker use the type's burst up,
    first = one.admit("w1", [ask("a", "alice", **export), ask("b", "bob", **export)])
    assert verdicts(first) == [Verdict.ADMITTED, Verdict.ADMITTED]
    assert [round(g.type_tokens, 3) for g in first.grants] == [1.0, 0.0]
    assert [g.tokens for g in first.grants] == [None, None]  # no key has a rate
    # so another worker's export of a third key waits, while another type's job runs;
    reply = two.admit("w2", [ask("c", "carol", **export), ask("d", "carol")])
    assert verdicts(reply) == [Verdict.RATE_LIMIT, Verdict.ADMITTED]
    assert round(reply.grants[0].type_tokens, 3) == 0.0
    assert reply.grants[1].type_tokens is None
    assert reply.grants[0].accumulated == 0.0  # a refused start charges nothing
    # an export that never ran gives the type its start back.
    one.finish("w1", [Done("a", first.grants[0].token, None, unstarted=True)])
    assert verdicts(two.admit("w2", [ask("c", "carol", **export)])) == [Verdict.ADMITTED]


def test_a_types_rate_per_cost_and_a_keys_rate_are_both_paid(make_store):
    store = make_store(lifecycle=NEVER)
    both = {
        "type": "export",
        "type_rate": HOURLY,
        "type_burst": 5.0,
        "type_per_cost": True,
        "rate": HOURLY,
        "burst": 3.0,
    }
    reply = store.admit("w1", [ask(f"j{i}", "alice", cost=2.0, **both) for i in range(4)])
    # the type's bucket (5 s of cost) stops the third; the key's (3 starts) would have let it
    assert verdicts(reply)[:3] == [Verdict.ADMITTED, Verdict.ADMITTED, Verdict.ADMITTED]
    assert [round(g.type_tokens, 3) for g in reply.grants] == [3.0, 1.0, -1.0, -1.0]
    assert [round(g.tokens, 3) for g in reply.grants] == [2.0, 1.0, 0.0, 0.0]
    assert verdicts(reply)[3] == Verdict.RATE_LIMIT


# -- two-level keys (core/tenants.py): a tenant's cost and running jobs beside its keys' -------


def tenant_ask(uid: str, key: str, **kwargs) -> Ask:
    """An ask of key ``key`` with its tenant (the text before "/", or the key itself)."""
    return ask(uid, key, tenant=key.split("/", 1)[0], **kwargs)


def test_a_tenant_is_charged_beside_its_key_and_a_heartbeat_reads_both(make_store):
    store = make_store(lifecycle=NEVER)
    reply = store.admit("w1", [tenant_ask("a", "acme/alice", cost=4.0, tenant_weight=2.0)])
    [a] = reply.grants
    assert (a.verdict, a.accumulated, a.tenant_accumulated) == (Verdict.ADMITTED, 4.0, 2.0)
    [b] = store.admit("w2", [tenant_ask("b", "acme/bob", cost=1.0, tenant_weight=2.0)]).grants
    assert (b.accumulated, b.tenant_accumulated) == (1.0, 2.5)  # the tenant sums its keys
    [flat] = store.admit("w1", [ask("c", "acme/carol", cost=1.0)]).grants
    assert flat.tenant_accumulated is None  # an ask without a tenant: flat keys
    view = store.heartbeat("w1", [], ["acme/alice"], tenants=["acme", "other"])
    assert view.tenant_accumulated == {"acme": 2.5, "other": 0.0}
    assert view.tenants == {"acme": 2}  # running jobs, fleet-wide; none of "other"
    assert view.accumulated == {"acme/alice": 4.0}
    store.finish("w1", [Done("a", a.token, 1.0)])
    assert store.heartbeat("w1", [], [], tenants=["acme"]).tenants == {"acme": 1}


def test_a_tenants_cap_counts_its_keys_on_every_worker(make_store):
    store = make_store(lifecycle=NEVER)
    store.admit("w1", [tenant_ask("a", "acme/alice", tenant_cap=2)])
    reply = store.admit(
        "w2",
        [tenant_ask("b", "acme/bob", tenant_cap=2), tenant_ask("c", "acme/carol", tenant_cap=2)],
    )
    assert verdicts(reply) == [Verdict.ADMITTED, Verdict.TENANT_CAP]
    assert reply.tenants == {"acme": 2}
    [other] = store.admit("w2", [tenant_ask("d", "beta/x", tenant_cap=2)]).grants
    assert other.verdict is Verdict.ADMITTED  # another tenant's cap is its own


def test_a_job_given_back_unstarted_refunds_its_tenant_too(make_store):
    store = make_store(lifecycle=NEVER)
    store.admit("w1", [tenant_ask("a", "acme/alice", cost=2.0, tenant_weight=0.5)])
    [b] = store.admit("w1", [tenant_ask("b", "acme/bob", cost=1.0, tenant_weight=0.5)]).grants
    assert b.tenant_accumulated == 6.0
    store.finish("w1", [Done("b", b.token, None, unstarted=True)])
    view = store.heartbeat("w1", [], [], tenants=["acme"])
    assert view.tenant_accumulated == {"acme": 4.0}
    assert view.tenants == {"acme": 1}


def test_with_advance_idle_a_tenant_starts_from_the_least_active_tenant_and_a_key_from_its_own(
    make_store,
):
    store = make_store(lifecycle=CostLifecycle(cost_ttl=None, advance_idle=True))
    store.admit("w1", [tenant_ask("b", "beta/y", cost=2.0)])
    [a] = store.admit("w1", [tenant_ask("a", "acme/x", cost=10.0)]).grants
    assert (a.accumulated, a.tenant_accumulated) == (10.0, 12.0)  # acme starts from beta's 2
    # A key new to acme starts from acme's least running key (10), not beta's (2).
    [z] = store.admit("w1", [tenant_ask("c", "acme/z", cost=1.0)]).grants
    assert (z.accumulated, z.tenant_accumulated) == (11.0, 13.0)
    # A new tenant starts from the least running tenant's cost: beta's 2.
    [g] = store.admit("w1", [tenant_ask("d", "gamma/q", cost=1.0)]).grants
    assert (g.accumulated, g.tenant_accumulated) == (1.0, 3.0)  # gamma's first key: no floor
    # acme/x is charged again: its place among acme's keys moves (10 -> 12), so a key new to
    # acme now starts from acme/z's 11.
    store.admit("w1", [tenant_ask("e", "acme/x", cost=2.0)])
    [w] = store.admit("w1", [tenant_ask("f", "acme/w", cost=0.0)]).grants
    assert w.accumulated == 11.0


def test_an_idle_tenants_cost_expires(make_store):
    store = make_store(lifecycle=CostLifecycle(cost_ttl=0.3, estimate_ttl=None))
    [a] = store.admit("w1", [tenant_ask("a", "acme/x", cost=3.0)]).grants
    store.admit("w1", [tenant_ask("b", "busy/y", cost=1.0)])
    store.finish("w1", [Done("a", a.token, 1.0)])

    def expired():
        view = store.heartbeat("w1", [], [], tenants=["acme", "busy"])
        return view.tenant_accumulated == {"acme": 0.0, "busy": 1.0}

    wait_until(expired, 10, "the idle tenant's cost to expire, the busy one's to stay")


def test_a_periodic_reset_zeroes_a_tenants_cost(make_store):
    reset = make_store(lifecycle=CostLifecycle(cost_ttl=None, reset_interval=0.3))
    reset.admit("w1", [tenant_ask("a", "acme/x", cost=3.0)])
    wait_until(
        lambda: reset.heartbeat("w1", [], [], tenants=["acme"]).tenant_accumulated == {"acme": 0.0},
        10,
        "the periodic reset of the tenant's cost",
    )


def test_a_periodic_reset_leaves_idle_buckets_to_be_forgotten_with_their_cost(make_store):
    # Given a key and tenant limited to one start an hour, idle before a periodic reset, and
    # another running through it (its cost, zeroed, is absent from Redis's hash),
    store = make_store(lifecycle=CostLifecycle(cost_ttl=0.6, estimate_ttl=None, reset_interval=0.2))
    slow = {"rate": HOURLY, "burst": 1.0, "tenant_rate": HOURLY, "tenant_burst": 1.0}
    [a] = store.admit("w1", [tenant_ask("a", "acme/alice", cost=1.0, **slow)]).grants
    [b] = store.admit("w1", [tenant_ask("b", "beta/bob", cost=1.0, **slow)]).grants
    store.finish("w1", [Done("a", a.token, 0.1)])

    def reset() -> bool:
        store.heartbeat("w1", [], [])
        return store.accumulated_cost("beta/bob") == 0.0

    wait_until(reset, 10, "the periodic reset")
    store.finish("w1", [Done("b", b.token, 0.1)])
    # then once idle past the TTL, each is new again: a full bucket (without the reset's
    # leak they would be remembered, spent, for good).
    for uid, key in (("c", "acme/alice"), ("d", "beta/bob")):
        again = [tenant_ask(uid, key, **slow)]
        admitted = lambda: verdicts(store.admit("w1", again)) == [Verdict.ADMITTED]  # noqa: B023, E731
        wait_until(admitted, 10, f"{key} and its tenant forgotten")


def test_register_counts_a_tenants_jobs_again(make_store):
    store = make_store(lifecycle=NEVER)
    job = Running("r1", first_token(time.time()) + 5, "clone", 8, "", "clone/", "acme/x", 1.0, 1.0,
                  "acme", 0.5)  # fmt: skip
    assert store.register("w1", [job]).registered == 1
    assert store.heartbeat("w1", [], [], tenants=["acme"]).tenants == {"acme": 1}
    store.finish("w1", [Done("r1", job.token, None)])
    assert store.heartbeat("w1", [], [], tenants=["acme"]).tenants == {}


def test_a_tenants_rate_counts_all_its_keys_starts_on_every_worker(make_store):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    acme = {"tenant_rate": HOURLY, "tenant_burst": 2.0}
    # two keys of acme on one worker use acme's burst up (neither key has a rate of its own),
    first = one.admit("w1", [tenant_ask("a", "acme/x", **acme), tenant_ask("b", "acme/y", **acme)])
    assert verdicts(first) == [Verdict.ADMITTED, Verdict.ADMITTED]
    assert [round(g.tenant_tokens, 3) for g in first.grants] == [1.0, 0.0]
    assert [g.tokens for g in first.grants] == [None, None]
    # so a third key of acme waits on another worker, while another tenant's job runs;
    reply = two.admit("w2", [tenant_ask("c", "acme/z", **acme), tenant_ask("d", "beta/z", **acme)])
    assert verdicts(reply) == [Verdict.RATE_LIMIT, Verdict.ADMITTED]
    assert round(reply.grants[0].tenant_tokens, 3) == 0.0
    assert round(reply.grants[1].tenant_tokens, 3) == 1.0  # beta's own bucket
    assert reply.grants[0].accumulated == 0.0  # a refused start charges nothing
    assert reply.grants[0].tenant_accumulated == 2.0
    assert two.admit("w2", [tenant_ask("e", "gamma/q")]).grants[0].tenant_tokens is None
    # a start that never ran gives acme its start back.
    one.finish("w1", [Done("a", first.grants[0].token, None, unstarted=True)])
    assert verdicts(two.admit("w2", [tenant_ask("c", "acme/z", **acme)])) == [Verdict.ADMITTED]


def test_a_tenants_rate_per_cost_and_its_keys_rate_are_both_paid(make_store):
    store = make_store(lifecycle=NEVER)
    both = {"tenant_rate": HOURLY, "tenant_burst": 5.0, "tenant_per_cost": True}
    both |= {"rate": HOURLY, "burst": 3.0}
    reply = store.admit("w1", [tenant_ask(f"j{i}", "acme/x", cost=2.0, **both) for i in range(4)])
    # the tenant's bucket (5 s of cost) stops the fourth; the key's (3 starts) the fourth too
    assert verdicts(reply) == [Verdict.ADMITTED] * 3 + [Verdict.RATE_LIMIT]
    assert [round(g.tenant_tokens, 3) for g in reply.grants] == [3.0, 1.0, -1.0, -1.0]
    assert [round(g.tokens, 3) for g in reply.grants] == [2.0, 1.0, 0.0, 0.0]


def test_a_tenants_bucket_is_forgotten_with_its_cost(make_store):
    store = make_store(lifecycle=CostLifecycle(cost_ttl=0.2, estimate_ttl=None))
    slow = {"tenant_rate": HOURLY}
    [a] = store.admit("w1", [tenant_ask("a", "acme/x", **slow)]).grants
    assert verdicts(store.admit("w1", [tenant_ask("b", "acme/y", **slow)])) == [Verdict.RATE_LIMIT]
    store.finish("w1", [Done("a", a.token, 0.1)])
    # idle past its TTL, acme is a new tenant: full bucket (nothing remembers its starts)
    wait_until(
        lambda: (
            verdicts(store.admit("w1", [tenant_ask("b", "acme/y", **slow)])) == [Verdict.ADMITTED]
        ),
        10,
        "acme forgotten",
    )


def test_a_paused_tenant_is_refused_for_every_one_of_its_keys(make_store):
    store = make_store(lifecycle=NEVER)
    store.update_policies(lambda old: ("{}", [], [], ["acme"]))
    reply = store.admit(
        "w1", [tenant_ask("a", "acme/x"), tenant_ask("b", "acme/y"), tenant_ask("c", "beta/x")]
    )
    assert verdicts(reply) == [Verdict.PAUSED, Verdict.PAUSED, Verdict.ADMITTED]
    assert reply.grants[0].tenant_accumulated == 0.0  # a refusal charges nothing
    # an ask that names no tenant (flat keys) is a key's, whatever its name
    assert verdicts(store.admit("w1", [ask("d", "acme")])) == [Verdict.ADMITTED]
    store.update_policies(lambda old: ("{}", [], [], []))  # resumed
    assert verdicts(store.admit("w1", [tenant_ask("a", "acme/x")])) == [Verdict.ADMITTED]
