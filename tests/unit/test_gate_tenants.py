"""Two-level keys on workers' gates (issue 34 part 2): a tenant's cap and cost hold across the
fleet through the store, and a tenant of many keys gets one tenant's share."""

from __future__ import annotations

import pytest
from gate_world import World

TENANTS = {"fair_key_separator": "/"}


def test_a_tenants_cap_counts_its_keys_on_every_worker() -> None:
    # Given two workers sharing a store, and tenant acme capped at 2 jobs over all its keys,
    one = World(slots=2, fair_keys={"acme": {"max_concurrency": 2}}, **TENANTS)
    two = World(slots=2, store=one.store, name="w2", fair_keys={"acme": {"max_concurrency": 2}},
                **TENANTS)  # fmt: skip
    # when one worker runs two jobs of acme's keys,
    one.deliver("a1", key="acme/alice")
    one.deliver("a2", key="acme/bob")
    assert one.pool.ids() == ["a1", "a2"]
    # the other holds a third key's job of acme, and its slot goes to another tenant's job;
    two.deliver("a3", key="acme/carol")
    two.deliver("b1", key="beta/x")
    assert two.pool.ids() == ["b1"]
    assert two.gate.job_status("a3")["blocked_by"] == ["tenant_cap"]
    # once one of acme's jobs ends and the other worker hears of it, acme/carol starts.
    one.run(one.pool.running()[0], 1.0)
    two.clock.advance(2.0)  # past the other worker's next look at the store (a beat a second)
    two.gate.sweep()
    assert "a3" in two.pool.ids()


def test_a_tenant_of_many_keys_gets_one_share_beside_a_tenant_of_one() -> None:
    # One worker, one slot: tenant S publishes under ten keys, tenant T under one, both
    # backlogged with jobs of the same cost;
    w = World(slots=1, **TENANTS)
    for i in range(30):
        w.deliver(f"s{i}", key=f"S/{i % 10}")
    for i in range(30):
        w.deliver(f"t{i}", key="T")
    started = []
    for _ in range(20):
        (req,) = w.pool.running()
        started.append(req.id)
        w.run(req, 1.0)
    # T starts every other job (flat keys would give it one start in eleven).
    assert sum(1 for uid in started if uid.startswith("t")) == 10


def test_a_tenants_rate_holds_across_the_fleet_and_wakes_each_gate_when_it_refills() -> None:
    # Given two workers sharing a store, and tenant acme at 2 starts a second over its keys,
    rated = {"fair_keys": {"acme": {"rate": "2/s"}}, **TENANTS}
    one = World(slots=2, **rated)
    two = World(slots=2, store=one.store, name="w2", **rated)
    # when one worker starts a job of acme/alice, the other's job of acme/bob waits for the
    # tenant's bucket (the store refused it), while another tenant's job takes its slot;
    one.deliver("a1", key="acme/alice")
    two.deliver("a2", key="acme/bob")
    two.deliver("b1", key="beta/x")
    assert one.pool.ids() == ["a1"]
    assert two.pool.ids() == ["b1"]
    assert two.gate.job_status("a2")["blocked_by"] == ["rate_limit"]
    # then that worker has booked a decision for the refill, and makes it then.
    (due,) = two.timer.booked()
    assert due == pytest.approx(two.clock.now() + 0.5)
    two.clock.set(due)
    assert two.timer.fire_due() == 1
    assert two.pool.ids() == ["b1", "a2"]


def test_the_fleet_shares_a_tenants_cost() -> None:
    # Tenant S has used a lot on one worker: another worker that sees S's new key for the
    # first time puts T's job first, since the store says what S as a whole has used.
    one = World(slots=1, **TENANTS)
    two = World(slots=1, store=one.store, name="w2", **TENANTS)
    for i in range(3):
        req = one.deliver(f"s{i}", key="S/a")
        one.run(req, 1.0)
    two.deliver("hold", key="X")  # occupies two's slot while both arrive
    two.deliver("s-new", key="S/b")
    two.deliver("t1", key="T")
    two.clock.advance(2.0)  # a beat reads the store's costs of the tenants held here
    two.gate.sweep()
    two.run(two.pool.running()[0], 1.0)
    assert two.pool.ids() == ["hold", "t1"]  # not S's new key, though it came first


def test_inspect_stats_name_the_tenants_with_most_jobs_and_the_rest_as_other() -> None:
    w = World(slots=1, fair_metrics_top_keys=1, **TENANTS)
    for i in range(4):
        w.deliver(f"s{i}", key=f"S/{i}")
    w.deliver("t0", key="T/x")
    w.deliver("u0", key="U")
    tenants = w.stats()["fair-tenants"]
    assert set(tenants) == {"S", "other"}
    assert tenants["S"]["running"] + tenants["S"]["held"] == 4
    assert tenants["other"]["running"] + tenants["other"]["held"] == 2
    flat = World(slots=1)
    flat.deliver("a", key="S/1")
    assert "fair-tenants" not in flat.stats()
