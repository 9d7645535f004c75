"""The scheduler's state machine made to keep jobs waiting on free conflicts (a file of its own,
so that a parallel run spreads it beside tests/property/test_state_machine.py): the oracle and
the structures' invariants as there."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import initialize, precondition, rule
from test_state_machine import SchedulerMachineWithStructures, first_waiters

from celery_fair.core import KeyPolicies
from strategies import TENANT_KEYS, costs, job_types, key_policies


class WaitersMachine(SchedulerMachineWithStructures):
    """The same machine made to wait on conflicts: two-level keys, every type in one conflict
    group and every job on one of two repositories, so that jobs park on held conflicts and
    wait as their conflict's first waiter once it is free; and what the fleet says of such a
    waiter's key (other workers run its cap, or it has used more), after which another waiter
    may come first."""

    @initialize(
        types=job_types().map(
            lambda types: {n: {**spec, "conflict_group": "git"} for n, spec in types.items()}
        ),
        capacity=st.integers(2, 5),
        keys=key_policies(tenants=True),
        priority_scope=st.sampled_from(["global", "key"]),
    )
    def setup(self, types, capacity, keys, priority_scope):
        super().setup.__wrapped__(  # type: ignore[attr-defined]
            self, types, capacity, 0.3, None, None, None, False, keys, None,
            [None] * 4, [{}] * 4, False, priority_scope, "/",
        )  # fmt: skip

    @rule(
        data=st.data(),
        job_id=st.sampled_from(["r1", "r2"]),
        key=st.sampled_from(TENANT_KEYS),
        cost=costs,
    )
    def submit(self, data, job_id, key, cost):
        jtype = data.draw(st.sampled_from(self.types))
        ref = self.next_ref
        self.next_ref += 1
        self.core.submit(ref, jtype, job_id, key, arrival=self.now, cost=cost)
        self.ref.submit(ref, jtype, job_id, key, self.now, cost, self.now, None)
        self.pending.append(ref)

    @rule(
        data=st.data(),
        job_id=st.sampled_from(["r1", "r2"]),
        keys=st.lists(st.sampled_from(TENANT_KEYS), min_size=2, max_size=4, unique=True),
        cost=costs,
    )
    def crowd(self, data, job_id, keys, cost):
        """Several keys (often of one tenant) ask for one repository at once: when its holder
        ends, one of several waiters comes first, and the others stay parked behind it."""
        for key in keys:
            self.submit.__wrapped__(self, data, job_id, key, cost)  # type: ignore[attr-defined]

    def _arrive(self, data, job_id, key, cost):
        """One job of ``churn``, on one of the two repositories."""
        repo = data.draw(st.sampled_from(["r1", "r2"]))
        WaitersMachine.submit.__wrapped__(self, data, repo, key, cost)  # type: ignore[attr-defined]

    def _first(self):
        """The keys of the free conflicts' first waiters."""
        return sorted({job.key.name for job in first_waiters(self.core)})

    @precondition(lambda self: hasattr(self, "core") and bool(self._first()))
    @rule(data=st.data(), n=st.integers(1, 3), value=st.sampled_from([5, 40]))
    def cap_or_charge_a_first_waiter(self, data, n, value):
        key = data.draw(st.sampled_from(self._first()))
        how = data.draw(st.sampled_from(["elsewhere", "capped", "charged"]))
        if how == "elsewhere":  # other workers run n of its jobs (it may have a cap)
            keys = {**self.ref.elsewhere_keys, key: n}
            tiers, types = dict(self.ref.elsewhere_tiers), dict(self.ref.elsewhere_types)
            self.core.set_running_elsewhere(
                tiers, types, keys, urgent_passes=self.ref.urgent_passes
            )
            self.ref.elsewhere_keys = keys
        elif how == "capped":  # its policy now runs none of its jobs (a tenant's, if no "/")
            policies = {**self.ref.keys, key: {"max_concurrency": 0}}
            self.core.set_key_policies(KeyPolicies.from_mapping(policies))
            self.ref.set_keys(policies, self.now)
            self.policies_changed = True
        else:  # it has used more, as the fleet says
            self.core.set_accumulated(key, value)
            self.ref.set_accumulated(key, value)


TestWaitersMachine = WaitersMachine.TestCase
