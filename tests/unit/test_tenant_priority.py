"""A key's ``max_priority`` and the priority scope (issue 34, docs/design.md 5g), below the
broker: the core's rule, the producer's refusal, the worker's lowering and its count, and the
settings that name them."""

from __future__ import annotations

import pytest
from celery import Celery
from gate_world import World

from celery_fair import ConfigurationError, SchedulerError, connect, fair_task, send
from celery_fair.core import JobType, KeyPolicies, Scheduler, SchedulerConfig, SimClock
from celery_fair.policies import RuntimePolicies
from celery_fair.settings import FairSettings
from celery_fair.store.memory import MemoryStore


def scheduler(capacity=1, scope="global", keys=None, **caps):
    return Scheduler(
        SchedulerConfig(
            capacity,
            tier_caps={1: None, 4: None, 6: None, 8: None, 9: None},
            keys=KeyPolicies.from_mapping(keys or {}),
            priority_scope=scope,
        ),
        SimClock(),
        [JobType("hi", priority=8), JobType("mid", priority=6), JobType("lo", priority=1)],
    )


def starts(s, n, elapsed=1.0):
    """Admit and finish ``n`` jobs one at a time; their uids in start order."""
    out = []
    for _ in range(n):
        (a,) = s.schedule()
        out.append(a.uid)
        s.complete(a.uid, elapsed)
    return out


# -- the core ---------------------------------------------------------------------------


def test_a_job_above_its_keys_bound_waits_at_the_bound_and_asking_lower_is_kept():
    s = scheduler(keys={"cheap": {"max_priority": 4}})
    s.submit("c9", "hi", fairness_key="cheap", priority=9)  # asked above: 4
    s.submit("c8", "hi", fairness_key="cheap")  # its type's 8 is above too: 4
    s.submit("c1", "hi", fairness_key="cheap", priority=1)  # below: kept
    s.submit("m", "mid", fairness_key="other")
    assert [s.status(u).priority for u in ("c9", "c8", "c1", "m")] == [4, 4, 1, 6]
    assert s.priority_for("hi", "cheap", 9) == 4
    assert s.priority_for("hi", "cheap", None) == 4
    assert s.priority_for("lo", "cheap", None) is None  # its type's 1: no change
    assert s.priority_for("hi", "never-seen", 9) == 9  # a key not known yet: its policy
    assert starts(s, 4) == ["m", "c9", "c8", "c1"]


def test_a_bound_lowered_at_runtime_lowers_pending_jobs_in_their_order_and_raised_lifts_none():
    s = scheduler()
    for i in range(3):
        s.submit(f"a{i}", "hi", fairness_key="a")
        s._clock.advance(1.0)
    s.submit("m", "mid", fairness_key="b")
    s.set_key_policies(KeyPolicies.from_mapping({"a": {"max_priority": 4}}))
    assert {s.status(f"a{i}").priority for i in range(3)} == {4}
    assert [s.status(f"a{i}").arrival for i in range(3)] == [0.0, 1.0, 2.0]  # kept
    s.set_key_policies(KeyPolicies())
    assert s.status("a0").priority == 4  # the core does not keep what was asked
    assert starts(s, 4) == ["m", "a0", "a1", "a2"]


@pytest.mark.parametrize("scope", ["global", "key"])
def test_a_tenant_at_priority_9_and_one_at_1_share_by_weight_only_with_scope_key(scope):
    s = scheduler(scope=scope)
    for i in range(10):
        s.submit(f"A{i}", "hi", fairness_key="A", priority=9)
        s.submit(f"B{i}", "lo", fairness_key="B")
    first = starts(s, 10)
    a_share = sum(u.startswith("A") for u in first)
    assert a_share == (10 if scope == "global" else 5)
    # and with "key", each key's own jobs still start in order
    assert [u for u in first if u.startswith("B")] == sorted(u for u in first if u[0] == "B")


def test_with_scope_key_a_keys_priority_orders_only_its_own_jobs():
    s = scheduler(scope="key")
    s.submit("a0", "lo", fairness_key="a")
    assert starts(s, 1) == ["a0"]  # a has used 1, b nothing
    s.submit("a-lo", "lo", fairness_key="a")
    s.submit("a-hi", "hi", fairness_key="a")
    s.submit("b-lo", "lo", fairness_key="b")
    # b's priority-1 job before a's priority-8 one; then a's 8 before its own earlier 1
    assert starts(s, 3) == ["b-lo", "a-hi", "a-lo"]
    # at equal cost, the higher priority goes first (then arrival)
    s = scheduler(scope="key")
    s.submit("b-lo", "lo", fairness_key="b")
    s.submit("a-hi", "hi", fairness_key="a")
    assert starts(s, 2) == ["a-hi", "b-lo"]


def test_bad_scope_and_bad_bound_are_refused_with_what_is_expected():
    with pytest.raises(ConfigurationError, match="priority_scope must be one of 'global', 'key'"):
        SchedulerConfig(1, priority_scope="tenant")
    with pytest.raises(ConfigurationError, match="max_priority must be an int >= 1 or None"):
        KeyPolicies.from_mapping({"a": {"max_priority": 0}})
    with pytest.raises(ConfigurationError, match="fair_priority_scope"):
        FairSettings.from_mapping({"fair_priority_scope": "tenants"})
    with pytest.raises(ConfigurationError, match="max_priority"):
        FairSettings.from_mapping({"fair_keys": {"a": {"max_priority": "high"}}})
    assert FairSettings.from_mapping({"fair_priority_scope": "key"}).scheduler_config(
        2
    ).priority_scope == ("key")


# -- the worker ---------------------------------------------------------------------------


def test_the_worker_lowers_a_message_above_its_keys_bound_counts_it_and_charges_that_tier():
    w = World(slots=1, fair_keys={"cheap": {"max_priority": 4}}, fair_tier_caps={4: None})
    w.deliver("t1", job_type="urgent", key="cheap")  # its type's 9 is above the bound
    w.deliver("t2", job_type="build", key="cheap", headers={"fair_priority": 9})
    w.deliver("t3", job_type="build", key="other")
    assert w.pool.ids() == ["t1"]  # the pool was free: the lowered job still runs
    assert w.gate.job_status("t2")["priority"] == 4
    assert w.store.tiers == {4: 1}  # the store counts it in the tier it was given
    assert w.stats()["fair-priority-lowered"] == 2
    w.pool.finish(w.pool.handed[0])
    assert w.pool.ids() == ["t1", "t3"]  # other's 8 before cheap's lowered 4


# -- the producer -------------------------------------------------------------------------


@pytest.fixture
def app():
    app = Celery("t", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = "q"
    app.conf.fair_shards = 1
    app.conf.fair_keys = {"tenant:*": {"max_priority": 4}}
    app.conf.fair_tier_caps = {2: None, 4: None}
    yield app
    app.close()


def queued(app):
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue("q")
        out = []
        while queue.qsize():
            out.append(queue.get(timeout=1).headers)
        queue.close()
    return out


def test_a_producer_refuses_a_priority_above_its_keys_bound_and_publishes_nothing(app):
    @fair_task(app=app, type="clone", priority=8)
    def clone(repo): ...

    with pytest.raises(SchedulerError, match="above fairness key 'tenant:a''s max_priority 4"):
        clone.apply_async(["x"], fairness_key="tenant:a", fair_priority=8)
    with pytest.raises(SchedulerError, match="max_priority 4"):
        send(app, "clone", ["x"], job_type="clone", fairness_key="tenant:b", fair_priority=8)
    assert queued(app) == []
    # At or below it, or no priority of its own (its type's 8: the worker lowers it), or
    # another key: published.
    clone.apply_async(["a"], fairness_key="tenant:a", fair_priority=4)
    clone.apply_async(["b"], fairness_key="tenant:a")
    clone.apply_async(["c"], fairness_key="ops", fair_priority=8)
    assert [h.get("fair_priority") for h in queued(app)] == [4, None, 8]


def test_a_producer_checks_the_runtime_bound_it_last_read_at_most_once_a_second(app, monkeypatch):
    store = MemoryStore()
    reads = []
    real = store.policies
    monkeypatch.setattr(store, "policies", lambda: reads.append(1) or real())
    monkeypatch.setattr(connect, "shared_store", lambda _app: store)
    now = [100.0]
    monkeypatch.setattr(connect.time, "monotonic", lambda: now[0])

    @fair_task(app=app, type="clone", priority=8)
    def clone(repo): ...

    clone.apply_async(["x"], fairness_key="ops", fair_priority=8)
    doc = RuntimePolicies().with_key("ops", max_priority=2).to_json()
    store.update_policies(lambda _old: (doc, (), (), ()))
    clone.apply_async(["y"], fairness_key="ops", fair_priority=8)  # not read again yet
    assert len(reads) == 1
    now[0] += 1.0
    with pytest.raises(SchedulerError, match="'ops''s max_priority 2"):
        clone.apply_async(["z"], fairness_key="ops", fair_priority=8)
    assert len(reads) == 2
    assert len(queued(app)) == 2


def test_a_bound_lowered_while_a_job_is_held_reaches_the_worker_and_the_store_counts_it_so():
    w = World(slots=1, fair_tier_caps={4: None})
    first = w.deliver("t1", key="b")
    w.deliver("t2", key="a")
    w.deliver("t3", key="a", headers={"fair_priority": 9})
    doc = RuntimePolicies().with_key("a", max_priority=4).to_json()
    w.store.update_policies(lambda _old: (doc, (), (), ()))
    w.clock.advance(2.0)  # past the engine's next look at the store (a beat a second)
    w.gate.sweep()
    w.deliver("t4", key="c")
    assert w.stats()["fair-policies-version"] == 1
    assert [w.gate.job_status(t)["priority"] for t in ("t2", "t3", "t4")] == [4, 4, 8]
    assert w.gate.reprioritize("t2", 9) == "ok"  # job control is bounded too
    assert w.gate.job_status("t2")["priority"] == 4
    w.run(first, 1.0)
    assert w.pool.ids() == ["t1", "t4"]
    w.run(w.pool.running()[0], 1.0)
    assert w.pool.ids()[-1] == "t3"  # t2 was taken as new by its reprioritize
    assert w.store.tiers == {4: 1}
    assert w.stats()["fair-priority-lowered"] == 0  # lowered by a change, not at arrival


# -- fair jobs: the queued ones (part 4) --------------------------------------------------


def test_queued_jobs_are_listed_only_from_the_registry_and_never_by_type(app):
    from celery_fair.control import jobs

    with pytest.raises(ConfigurationError, match="set fair_track_submits = True"):
        jobs(app, state="queued")
    app.conf.fair_track_submits = True
    connect._settings.pop(app, None)  # read the settings again
    with pytest.raises(ConfigurationError, match="cannot be listed by type"):
        jobs(app, state="queued", type="clone")
    with pytest.raises(ConfigurationError, match=r"state must be one of .*queued"):
        jobs(app, state="waiting")


# -- seed 001's views: the allocation's changes, effective priorities (part 4) ------------


def test_each_change_of_a_keys_allocation_is_told_once_per_sweep_and_levels_are_counted():
    w = World(slots=2, fair_aging={"interval": 1, "max_effective_priority": 9})
    w.deliver("t1", key="a")
    w.gate.sweep()
    assert w.stats()["fair-allocation-changes"] == 1  # a: 0 -> 1 (its one job)
    for i in range(3):
        w.deliver(f"a{i}", key="a", job_id=f"r{i}")
        w.deliver(f"b{i}", key="b", job_id=f"s{i}")
    w.gate.sweep()
    # a: 1 -> 1 of 2 slots, b: 0 -> 1: one change
    assert w.stats()["fair-allocation-changes"] == 2
    w.gate.sweep()  # nothing moved: nothing told
    assert w.stats()["fair-allocation-changes"] == 2
    # the held jobs by effective priority: 8, then 9 once they have waited (one level a second)
    assert w.gate.scheduler.pending_levels() == {8: 5}
    w.clock.advance(1.5)
    assert w.gate.scheduler.pending_levels() == {9: 5}
    assert w.gate.scheduler.running_by_key() == {"a": 2}  # t1, and a0 delivered before b0


def test_a_bound_lowered_under_a_first_waiter_puts_the_waiter_now_first_before_it():
    # Given one conflict ("r1") free again with two waiters: B's job, aged the highest and
    # so its first waiter, and C's, younger but aged above priority 1 too (found by the state
    # machine in a CI run),
    from celery_fair.core import Aging, JobType

    s = Scheduler(
        SchedulerConfig(1, tier_caps={1: None}, aging=Aging(interval=1.0)),
        SimClock(),
        [JobType("t", priority=1, conflict_group="git")],
    )
    s.submit("x", "t", "r1", "X")
    assert [a.uid for a in s.schedule()] == ["x"]
    s.submit("b", "t", "r1", "B")
    s._clock.advance(1.0)
    s.submit("c", "t", "r1", "C")
    s._clock.advance(3.0)  # B at 1 + 4, C at 1 + 3
    s.complete("x", 1.0)
    assert s.status("b").effective_priority > s.status("c").effective_priority > 1
    # when B's bound is lowered to 1 while its job is the first waiter,
    s.set_key_policies(KeyPolicies.from_mapping({"B": {"max_priority": 1}}))
    # then C's job comes first, and starts before B's.
    assert [a.uid for a in s.schedule()] == ["c"]
