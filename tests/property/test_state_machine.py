"""Random sequences of submit/cancel/complete/release/schedule/advance against the oracle.

After every step the core's decisions and bookkeeping must equal the oracle's, and the
invariants stated on the core's structures must hold.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from celery_fair.core import (
    Aging,
    CancelOutcome,
    CostLifecycle,
    JobState,
    JobType,
    KeyPolicies,
    PriorityOutcome,
    Scheduler,
    SchedulerConfig,
    SimClock,
)
from celery_fair.core.policy import key_blocks
from reference import RefScheduler, RefType
from strategies import (
    GROUPS,
    JOB_IDS,
    KEYS,
    PRIORITIES,
    TENANT_KEYS,
    agings,
    costs,
    job_types,
    key_policies,
    rate_terms,
)

# Flat keys and two-level ones: without a separator "a/x" is a key like any other.
MACHINE_KEYS = sorted(set(KEYS) | set(TENANT_KEYS))


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        types=job_types(),
        capacity=st.integers(0, 5),
        alpha=st.sampled_from([0.3, 0.5, 1.0]),
        cost_ttl=st.sampled_from([None, 1.0, 4.0]),
        estimate_ttl=st.sampled_from([None, 2.0]),
        reset_interval=st.sampled_from([None, 3.0]),
        advance_idle=st.booleans(),
        keys=st.one_of(
            st.just({}),
            key_policies(bounds=True, rates=True),
            key_policies(bounds=True, rates=True, tenants=True),
        ),
        aging=st.one_of(st.none(), agings()),
        type_aging=st.lists(st.one_of(st.none(), agings()), min_size=4, max_size=4),
        type_rates=st.lists(st.one_of(st.just({}), rate_terms()), min_size=4, max_size=4),
        allocation_caps=st.booleans(),
        priority_scope=st.sampled_from(["global", "key"]),
        key_separator=st.sampled_from([None, "/"]),
    )
    def setup(
        self,
        types,
        capacity,
        alpha,
        cost_ttl,
        estimate_ttl,
        reset_interval,
        advance_idle,
        keys,
        aging,
        type_aging,
        type_rates,
        allocation_caps,
        priority_scope,
        key_separator,
    ):
        self.separator = key_separator
        self.clock = SimClock()
        life = CostLifecycle(cost_ttl, estimate_ttl, reset_interval, advance_idle)
        jtypes = [
            JobType(
                name,
                spec["priority"],
                spec.get("max_concurrency"),
                spec.get("conflict_group", ""),
                spec.get("default_cost", 1),
                None if own is None else Aging.from_mapping(own),
                **rated,
            )
            for (name, spec), own, rated in zip(types.items(), type_aging, type_rates, strict=False)
        ]
        self.core = Scheduler(
            SchedulerConfig(
                capacity,
                alpha=alpha,
                lifecycle=life,
                keys=KeyPolicies.from_mapping(keys),
                aging=None if aging is None else Aging.from_mapping(aging),
                allocation_caps=allocation_caps,
                priority_scope=priority_scope,
                key_separator=key_separator,
            ),
            self.clock,
            jtypes,
        )
        self.ref = RefScheduler(
            capacity,
            {
                t.name: RefType(
                    t.name,
                    t.priority,
                    t.max_concurrency,
                    t.conflict_group,
                    t.default_cost,
                    own,
                    rated.get("rate"),
                    rated.get("burst") or 1,
                )
                for t, own, rated in zip(jtypes, type_aging, type_rates, strict=False)
            },
            alpha=alpha,
            cost_ttl=cost_ttl,
            estimate_ttl=estimate_ttl,
            reset_interval=reset_interval,
            advance_idle=advance_idle,
            keys=keys,
            aging=aging,
            allocation_caps=allocation_caps,
            priority_scope=priority_scope,
            key_separator=key_separator,
        )
        self.types = sorted(types)
        self.policies_changed = False  # a cap lowered under running jobs may be exceeded
        self.next_ref = 0
        self.pending: list[int] = []
        self.running: list[int] = []

    @property
    def now(self):
        return self.clock.now()

    @rule(
        data=st.data(),
        job_id=st.sampled_from(JOB_IDS),
        key=st.sampled_from(MACHINE_KEYS),
        back=st.sampled_from([0, 0, 0.5, 2]),
        cost=costs,
        priority=st.one_of(st.none(), st.none(), st.sampled_from(PRIORITIES)),
    )
    def submit(self, data, job_id, key, back, cost, priority):
        jtype = data.draw(st.sampled_from(self.types))
        ref = self.next_ref
        self.next_ref += 1
        arrival = max(0.0, self.now - back)
        self.core.submit(ref, jtype, job_id, key, arrival=arrival, cost=cost, priority=priority)
        self.ref.submit(ref, jtype, job_id, key, arrival, cost, self.now, priority)
        self.pending.append(ref)

    @rule(data=st.data(), priority=st.one_of(st.none(), st.sampled_from(PRIORITIES)))
    def reprioritize(self, data, priority):
        known = self.pending + self.running + [self.next_ref]
        ref = data.draw(st.sampled_from(known))
        got = self.core.reprioritize(ref, priority)
        assert got.value == self.ref.reprioritize(ref, priority, self.now)
        if got is PriorityOutcome.OK:
            view = self.core.status(ref)
            assert view is not None
            assert view.arrival == self.now
            mine = next(j for j in self.ref.pending if j.ref == ref)
            assert view.priority == self.ref.base(mine)  # as asked, or its key's bound

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def cancel(self, data):
        ref = data.draw(st.sampled_from(self.pending))
        assert self.core.cancel(ref) is CancelOutcome.CANCELLED
        assert self.ref.cancel(ref, self.now)
        self.pending.remove(ref)
        assert self.core.cancel(ref) is CancelOutcome.UNKNOWN

    @rule()
    def schedule(self):
        got = self.core.schedule()
        want = self.ref.schedule(self.now)
        assert [(a.uid, a.estimate, a.priority, a.effective_priority, a.urgent) for a in got] == [
            (j.ref, j.estimate, self.ref.base(j), *j.effective) for j in want
        ]
        for a in got:
            self.pending.remove(a.uid)
            self.running.append(a.uid)
            assert self.core.cancel(a.uid) is CancelOutcome.RUNNING

    @rule()
    def next_admission(self):
        got = self.core.next_admission()
        want = self.ref.next_admission(self.now)
        assert (got and (got.uid, got.estimate)) == (want and (want.ref, want.estimate))
        if got:
            self.pending.remove(got.uid)
            self.running.append(got.uid)

    @precondition(lambda self: self.core.running <= 5)
    @rule(capacity=st.integers(0, 5))
    def set_capacity(self, capacity):
        capacity = max(capacity, self.core.running)  # a pool shrinks as its jobs end
        self.core.set_capacity(capacity)
        self.ref.capacity = capacity

    @precondition(lambda self: self.running)
    @rule(data=st.data(), elapsed=st.sampled_from([0, 0.5, 1, 3.3, 12]))
    def complete(self, data, elapsed):
        ref = data.draw(st.sampled_from(self.running))
        release = self.core.complete(ref, elapsed)
        self.ref.complete(ref, elapsed, self.now)
        self.running.remove(ref)
        assert release.estimate == self.ref.estimates[(release.type, release.job_id)]

    @precondition(lambda self: self.running)
    @rule(data=st.data(), unstarted=st.booleans())
    def release(self, data, unstarted):
        ref = data.draw(st.sampled_from(self.running))
        self.core.release(ref, refund=unstarted)
        self.ref.complete(ref, None, self.now, refund=unstarted)
        self.running.remove(ref)

    @rule(
        data=st.data(),
        jobs=st.lists(
            st.tuples(st.sampled_from(JOB_IDS), st.sampled_from(MACHINE_KEYS), costs), max_size=4
        ),
        ends=st.integers(0, 2),
        elapsed=st.sampled_from([0, 0.5, 1, 3.3]),
        dt=st.sampled_from([0, 0.25, 1]),
    )
    def churn(self, data, jobs, ends, elapsed, dt):
        """A busy worker's step: a few jobs arrive, the scheduler decides, a few end, time
        passes; so that a run reaches many running and finished jobs (one rule among many
        would rarely string these together)."""
        for job_id, key, cost in jobs:
            self._arrive(data, job_id, key, cost)
        self.schedule()
        for _ in range(min(ends, len(self.running))):
            self.complete.__wrapped__(self, data, elapsed)  # type: ignore[attr-defined]
        self.clock.advance(dt)

    def _arrive(self, data, job_id, key, cost):
        """One job of ``churn``, submitted now at its type's priority."""
        SchedulerMachine.submit.__wrapped__(self, data, job_id, key, 0, cost, None)  # type: ignore[attr-defined]

    @rule(dt=st.sampled_from([0.25, 1, 2.5, 5]))
    def advance(self, dt):
        self.clock.advance(dt)

    # What a shared store feeds back: refusals, fleet costs, other workers' jobs.

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def revert(self, data):
        ref = data.draw(st.sampled_from(self.running))
        self.core.revert(ref)
        self.ref.revert(ref, self.now)
        self.running.remove(ref)
        self.pending.append(ref)

    @rule(key=st.sampled_from(MACHINE_KEYS), value=st.sampled_from([0, 0.5, 1, 3.3, 10, 40]))
    def set_accumulated(self, key, value):
        self.core.set_accumulated(key, value)
        self.ref.set_accumulated(key, value)

    @rule(data=st.data(), job_id=st.sampled_from(JOB_IDS), value=st.sampled_from([0, 0.7, 9]))
    def set_estimate(self, data, job_id, value):
        jtype = data.draw(st.sampled_from(self.types))
        self.core.set_estimate(jtype, job_id, value)
        self.ref.set_estimate(jtype, job_id, value, self.now)

    @rule(data=st.data())
    def set_running_elsewhere(self, data):
        tiers = data.draw(st.dictionaries(st.sampled_from(PRIORITIES), st.integers(0, 3)))
        types = data.draw(st.dictionaries(st.sampled_from(self.types), st.integers(0, 3)))
        # a store's counts (urgent jobs pass them), or a share while it is away (they bind)
        passes = data.draw(st.booleans())
        self.core.set_running_elsewhere(tiers, types, urgent_passes=passes)
        self.ref.elsewhere_tiers = tiers
        self.ref.elsewhere_types = types
        self.ref.urgent_passes = passes

    @rule(data=st.data())
    def set_running_elsewhere_by_key(self, data):
        tiers = dict(self.ref.elsewhere_tiers)
        types = dict(self.ref.elsewhere_types)
        keys = data.draw(st.dictionaries(st.sampled_from(MACHINE_KEYS), st.integers(0, 3)))
        passes = data.draw(st.booleans())
        self.core.set_running_elsewhere(tiers, types, keys, urgent_passes=passes)
        self.ref.elsewhere_keys = keys
        self.ref.urgent_passes = passes

    # Policies and pauses, changed while jobs wait and run.

    @rule(
        keys=st.one_of(
            key_policies(bounds=True, rates=True),
            key_policies(bounds=True, rates=True, tenants=True),
        )
    )
    def set_key_policies(self, keys):
        self.core.set_key_policies(KeyPolicies.from_mapping(keys))
        self.ref.set_keys(keys, self.now)
        self.policies_changed = True

    @rule(key=st.sampled_from(MACHINE_KEYS), pause=st.booleans())
    def pause_or_resume_key(self, key, pause):
        (self.core.pause_key if pause else self.core.resume_key)(key)
        self.ref.pause("key", key, pause, self.now)

    @rule(key=st.sampled_from(MACHINE_KEYS), pause=st.booleans())
    def pause_or_resume_tenant(self, key, pause):
        """The tenant of ``key`` (two-level keys; with flat keys a name no job runs under as a
        tenant, which changes nothing)."""
        tenant = key.split("/", 1)[0]
        (self.core.pause_tenant if pause else self.core.resume_tenant)(tenant)
        self.ref.pause("tenant", tenant, pause, self.now)

    @rule(data=st.data(), pause=st.booleans())
    def pause_or_resume_type(self, data, pause):
        jtype = data.draw(st.sampled_from(self.types))
        (self.core.pause_type if pause else self.core.resume_type)(jtype)
        self.ref.pause("type", jtype, pause, self.now)

    @rule(group=st.sampled_from(GROUPS[1:]), job_id=st.sampled_from(JOB_IDS[1:]))
    def hold_elsewhere(self, group, job_id):
        self.core.hold_elsewhere(group, job_id)
        self.ref.elsewhere_conflicts.add((group, job_id))

    @rule(group=st.sampled_from(GROUPS[1:]), job_id=st.sampled_from(JOB_IDS[1:]))
    def release_elsewhere(self, group, job_id):
        self.core.release_elsewhere(group, job_id)
        self.ref.elsewhere_conflicts.discard((group, job_id))

    @rule()
    def held_elsewhere(self):
        # Forgetting conflicts nobody here waits for must not change any decision.
        waited = set(self.core.held_elsewhere())
        assert waited <= self.ref.elsewhere_conflicts
        for ckey in self.ref.elsewhere_conflicts - waited:
            self.ref.elsewhere_conflicts.discard(ckey)

    @invariant()
    def bookkeeping_equals_the_oracle(self):
        snap = self.core.snapshot()
        assert snap.pending == len(self.ref.pending) == len(self.pending)
        assert snap.running == len(self.ref.running) == len(self.running)
        assert dict(snap.accumulated_cost) == self.ref.acc
        assert dict(snap.estimates) == self.ref.estimates
        if self.ref.key_separator is not None:
            assert self.core._tenants.costs() == self.ref.tacc

    @invariant()
    def caps_hold_and_conflicts_never_overlap(self):
        snap = self.core.snapshot()
        types = self.core.types
        assert snap.running <= snap.capacity
        for tier, n in snap.running_by_tier.items():
            cap = self.core.config.tier_cap(tier)
            assert cap is None or n <= cap
        for name, n in snap.running_by_type.items():
            cap = types[name].max_concurrency
            assert cap is None or n <= cap
        # A key's cap holds against what runs here, but for the jobs admitted urgent, which
        # pass it; the jobs a store says run elsewhere count against it only from the next
        # admission, as for types.
        urgent: dict[str, int] = {}
        for view in snap.jobs:
            if view.state is JobState.RUNNING and view.urgent:
                urgent[view.fairness_key] = urgent.get(view.fairness_key, 0) + 1
        for name, n in snap.running_by_key.items():
            cap = self.ref.policy(name).get("max_concurrency")
            assert cap is None or n - urgent.get(name, 0) <= cap or self.policies_changed
        if self.ref.key_separator is not None:  # and each tenant's, over all its keys
            tenants: dict[str, int] = {}
            for name, n in snap.running_by_key.items():
                tenant = self.ref.tenant(name)
                tenants[tenant] = tenants.get(tenant, 0) + n - urgent.get(name, 0)
            for tenant, n in tenants.items():
                cap = self.ref.tenant_policy(tenant).get("max_concurrency")
                assert cap is None or n <= cap or self.policies_changed
        held = set()
        for view in snap.jobs:
            group = types[view.type].conflict_group
            if view.state is JobState.RUNNING and group and view.job_id is not None:
                assert (group, view.job_id) not in held
                held.add((group, view.job_id))

    @invariant()
    def places_follow_the_dispatch_order(self):
        snap = self.core.snapshot()
        pending = [v for v in snap.jobs if v.state is JobState.PENDING]
        assert [v.place for v in pending] == list(range(1, len(pending) + 1))
        expected = sorted(self.ref.pending, key=lambda j: self.ref.order(j, self.now))
        assert [v.uid for v in pending] == [j.ref for j in expected]
        assert [(v.effective_priority, v.urgent) for v in pending] == [
            self.ref.effective(j, self.now) for j in expected
        ]
        seen: dict[str, int] = {}
        for v in pending:
            seen[v.fairness_key] = seen.get(v.fairness_key, 0) + 1
            assert v.place_in_key == seen[v.fairness_key]


TestSchedulerMachine = SchedulerMachine.TestCase


class SchedulerMachineWithStructures(SchedulerMachine):
    """The same machine, also checking the invariants written on the core's structures."""

    @invariant()
    def conflicts_are_registered_only_while_held_or_waited_for(self):
        for key, conflict in self.core._conflicts.items():
            assert conflict.key == key
            assert conflict.holder is not None or conflict.lanes, conflict
            for cl in conflict.lanes.values():
                # Each waiter whose key (and tenant) may start comes no earlier than the place
                # its conflict lane's entry in its lane's waiters records; while the conflict
                # is free, there is such an entry if there is such a waiter.
                first = first_free(cl)
                if first is None:
                    assert cl.parked.size or conflict.holder is not None, (conflict, cl)
                    continue
                if cl.ver < 0:
                    assert conflict.holder is not None, (conflict, cl, first)
                    continue
                entries = [e for e in cl.lane.queue.waiters if e[-1] is cl and e[-2] == cl.ver]
                assert len(entries) == 1, (cl, entries)
                assert entries[0][:-2] == cl.rec
                assert cl.rec <= first.lane.order(first), (cl, cl.rec, first)

    @invariant()
    def a_blocked_key_is_at_its_cap_and_its_queues_have_no_entry(self):
        for key in self.core._accounts.keys.values():
            if key.blocked is not None:
                assert key.running >= key.cap, key
                for kq in key.blocked:
                    assert kq.blocked, kq
                    # no entry, unless its head has turned urgent (and passes the key's cap)
                    head = kq.head(False)
                    assert kq.ver == -1 or (
                        head is not None and head.lane.effective(head)[1] and not key.paused
                    ), kq
                    assert kq.live > 0, kq
                    assert kq.owner.queues.get(key) is kq

    @invariant()
    def a_blocked_tenant_is_at_its_cap_and_its_queues_have_no_entry(self):
        tenants = self.core._tenants
        for tenant in () if tenants is None else tenants.keys.values():
            assert tenant.running == sum(
                k.running for k in self.core._accounts.keys.values() if k.tenant is tenant
            )
            if tenant.blocked is not None:
                assert tenant.running >= tenant.cap, tenant
                for tq in tenant.blocked:
                    assert tq.tblocked, tq
                    assert tq.queues, tq
                    assert tq.parent.queues.get(tenant) is tq

    @invariant()
    def counters_equal_what_they_count(self):
        snap = self.core.snapshot()
        for lane in self.core._lanes.values():
            assert lane.running == snap.running_by_type[lane.type.name]
            assert lane.pending == sum(
                1 for v in snap.jobs if v.type == lane.type.name and v.state is JobState.PENDING
            )
        for (name, _), side in self.core._side.items():
            assert side.running == self.core._lanes[name].running
        assert sum(t.pending for t in self.core._tiers) == snap.pending
        for tier in self.core._tiers:
            assert tier.running == snap.running_by_tier[tier.priority]


TestSchedulerMachineWithStructures = SchedulerMachineWithStructures.TestCase


def first_free(cl):
    """The first waiter of conflict lane ``cl`` whose key (and tenant) may start, or None."""
    free = [j for j in cl.parked.jobs() if not key_blocks(j)]
    return min(free, key=lambda j: j.lane.order(j)) if free else None


def first_waiters(core):
    """The first waiter whose key (and tenant) may start of each conflict lane of a free
    conflict: the jobs a decision may admit from the conflicts."""
    firsts = (
        first_free(cl)
        for conflict in core._conflicts.values()
        if conflict.holder is None
        for cl in conflict.lanes.values()
    )
    return [job for job in firsts if job is not None]
