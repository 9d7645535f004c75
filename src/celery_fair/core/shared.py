"""What a shared store says: the rest of the fleet, as the core hears it.

A fleet of workers shares caps, conflicts and costs through a store; each worker's core orders
its own pending jobs and proposes admissions, and the store confirms or refuses them
(``celery_fair.engine``). ``Shared`` takes the store's answers in: an admission refused
(``revert``), the fleet's costs and estimates, what other workers run of each tier, type and
key (``set_running_elsewhere``), and the conflicts they hold (``hold_elsewhere``). Each keeps the
index right at once, as ``State``'s moves do; ``Scheduler`` inherits them.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from ..errors import SchedulerError, UnknownJob, UnknownJobType
from .costs import UNLIMITED, KeyState, cap_left
from .fairqueue import park_on, release
from .jobs import ELSEWHERE, Conflict, Lane
from .keys import rerank
from .state import _INF, _NUMBER, State, _type_of
from .tenants import unblock
from .types import JobState

__all__ = ["Shared"]


class Shared(State):
    """The operations by which a shared store's answers reach the core (see the module)."""

    def revert(self, uid: Hashable) -> None:
        """Undo the admission of running job ``uid``, as if it had never been admitted.

        The job is pending again at its old place (same arrival and submission order; lowered
        to its key's ``max_priority`` if that fell meanwhile), its slot and conflict are
        released, and its charge is refunded. The engine calls this
        when the store refuses an admission; when the refusal is a conflict held elsewhere,
        it calls ``hold_elsewhere`` first, and the job then waits on that conflict at once.
        O((1 + q) log n), q the key queues of its key.

        Raises:
            UnknownJob: ``uid`` is not a running job.
        """
        job = self._jobs.get(uid)
        if job is None or job.state is not JobState.RUNNING:
            raise UnknownJob(f"job {uid!r} is not running")
        lane = job.lane
        key = job.key
        self._start(job, -1)
        job.state = JobState.PENDING
        if key.blocked is not None and key.running < key.cap:
            unblock(key)
        if key.min_slots or key.share != UNLIMITED:
            rerank(key)
        tenant = key.tenant
        if tenant is not None:
            if tenant.blocked is not None and tenant.running < tenant.cap:
                unblock(tenant)
            if tenant.min_slots or tenant.share != UNLIMITED:
                rerank(tenant)
        conflict = None if job.ckey is None else self._conflicts.get(job.ckey)
        if conflict is not None and conflict.holder is job:
            conflict.holder = None
            if conflict.elsewhere:  # refused because another worker holds it: wait for it
                conflict.holder = ELSEWHERE
                self._elsewhere[conflict.key] = conflict
                park_on(conflict, job)
            else:  # back into the lane, where it waits as it did before its admission
                lane.queue.push(job)
                release(conflict)
        elif conflict is not None and conflict.holder is not None:
            park_on(conflict, job)
        else:
            lane.queue.push(job)
        self._set_acc(key, key.acc - job.charge)
        if tenant is not None:
            self._set_acc(tenant, tenant.acc - job.tcharge)
            if tenant.rate is not None:
                self._keys.refund_rate(tenant, job.estimate)
        if key.rate is not None:
            self._keys.refund_rate(key, job.estimate)
        if lane.rate is not None:
            self._keys.refund_rate(lane, job.estimate)
        bound = key.max_priority
        if bound is not None and lane.tier.priority > bound:  # it fell while the job ran
            self._move(job, self._lane_at(lane, bound), job.arrival, job.seq)

    def set_accumulated(self, fairness_key: str, value: float) -> None:
        """Make ``fairness_key``'s accumulated cost ``value`` (the fleet's, from a store).

        Unknown keys are ignored: the core tracks only keys with pending or running jobs, or
        idle ones not yet forgotten. O(1) when the cost grows; O(q log n) when it shrinks, q
        the key queues of the key.
        """
        if not (_type_of(value) in _NUMBER and 0 <= value < _INF):
            raise SchedulerError(f"accumulated cost must be a finite number >= 0, got {value!r}")
        key = self._accounts.keys.get(fairness_key)
        if key is not None and key.acc != value:
            self._set_acc(key, float(value))

    def set_tenant_accumulated(self, tenant: str, value: float) -> None:
        """Make ``tenant``'s accumulated cost ``value`` (the fleet's, from a store; two-level
        keys), as ``set_accumulated`` for a key. Ignored for a tenant not known here."""
        if not (_type_of(value) in _NUMBER and 0 <= value < _INF):
            raise SchedulerError(f"accumulated cost must be a finite number >= 0, got {value!r}")
        tenants = self._tenants
        tenant_state = None if tenants is None else tenants.keys.get(tenant)
        if tenant_state is not None and tenant_state.acc != value:
            self._set_acc(tenant_state, float(value))

    def set_tokens(self, fairness_key: str, level: float) -> None:
        """Make ``fairness_key``'s rate bucket ``level`` now (the fleet's, from a store): at
        most 0, the key starts nothing until it refills (core/rates.py). Ignored for a key
        the core does not know or that has no rate. O(1), plus what it blocks or unblocks.
        """
        self._adopt_level(self._accounts.keys.get(fairness_key), level)

    def set_tenant_tokens(self, tenant: str, level: float) -> None:
        """Make ``tenant``'s rate bucket ``level`` now (the fleet's, from a store; two-level
        keys), as ``set_tokens`` for a key. Ignored for a tenant not known here or without a
        rate."""
        tenants = self._tenants
        self._adopt_level(None if tenants is None else tenants.keys.get(tenant), level)

    def set_type_tokens(self, type: str, level: float) -> None:
        """Make job type ``type``'s rate bucket ``level`` now (the fleet's, from a store), as
        ``set_tokens`` for a key. Ignored for a type not registered or without a rate."""
        self._adopt_level(self._lanes.get(type), level)

    def _adopt_level(self, holder: KeyState | Lane | None, level: float) -> None:
        """A key's or a type's lane's bucket takes the store's ``level`` (``holder`` ``None``
        or without a rate: nothing to do)."""
        if not (_type_of(level) in _NUMBER and -_INF < level < _INF):
            raise SchedulerError(f"a bucket's level must be a finite number, got {level!r}")
        if holder is not None and holder.rate is not None:
            self._age(self._clock.now())
            self._keys.set_tokens(holder, float(level))
            self._woken_by()

    def set_estimate(self, type: str, job_id: str | None, value: float) -> None:
        """Make the estimate of ``(type, job_id)`` ``value`` (the fleet's, from a store). O(1)."""
        if type not in self._lanes:
            raise UnknownJobType(f"unknown job type {type!r}")
        if not (_type_of(value) in _NUMBER and 0 <= value < _INF):
            raise SchedulerError(f"estimate must be a finite number >= 0, got {value!r}")
        now = self._clock.now()
        self._estimates.set((type, job_id), float(value), now)
        self._expiring(self._estimates.ttl, now)

    def set_running_elsewhere(
        self,
        tiers: Mapping[int, int],
        types: Mapping[str, int],
        keys: Mapping[str, int] | None = None,
        *,
        urgent_passes: bool = True,
        tenants: Mapping[str, int] | None = None,
    ) -> None:
        """Count, against each cap, the jobs that other workers run (by priority, by type and,
        if given, by fairness key).

        A tier may then admit ``cap - elsewhere`` jobs here. Tiers and types not named run
        nothing elsewhere; with ``keys`` given, neither do keys not named (without it, the
        keys' counts stay as they were). An urgent job counts only the jobs running here
        against its tier's and type's caps, as a store then decides and holds the next free
        slot for it (docs/design.md 5e); with ``urgent_passes=False`` it keeps within
        ``cap - elsewhere`` like any job (a worker's share of each cap while the store is
        unreachable). With two-level keys, ``tenants`` says what other workers run of each
        tenant (with ``keys``; without it, a tenant's count is the sum of its keys').
        O(tiers + types + keys + tenants).
        """
        self._urgent_passes = urgent_passes
        self._tiers_elsewhere = dict(tiers)
        for tier in self._tiers:
            tier.elsewhere = n = tiers.get(tier.priority, 0)
            tier.cap = cap_left(tier.limit, n)
        for name, lane in self._lanes.items():
            lane.elsewhere = types.get(name, 0)
            lane.recap()
        if keys is None:
            return
        self._keys.set_elsewhere(keys, tenants)

    def hold_elsewhere(self, group: str, job_id: str) -> None:
        """Another worker holds the conflict ``(group, job_id)``: its waiters here wait. O(1)."""
        ckey = (group, job_id)
        conflict = self._conflicts.get(ckey)
        if conflict is None:
            conflict = self._conflicts[ckey] = Conflict(ckey, self._conflicts)
        conflict.elsewhere = True
        self._elsewhere[ckey] = conflict
        if conflict.holder is None:
            conflict.holder = ELSEWHERE

    def release_elsewhere(self, group: str, job_id: str) -> None:
        """No other worker holds ``(group, job_id)`` any more. O(lanes waiting · log n)."""
        conflict = self._elsewhere.pop((group, job_id), None)
        if conflict is None:
            return
        conflict.elsewhere = False
        if conflict.holder is ELSEWHERE:
            release(conflict)

    def held_elsewhere(self) -> list[tuple[str, str]]:
        """The conflicts held elsewhere that pending jobs here wait for. O(those held elsewhere).

        Conflicts held elsewhere that nobody here waits for are forgotten on the way: there
        is nothing to wake, and the store is asked again if a job meets one later.
        """
        out = []
        for ckey, conflict in list(self._elsewhere.items()):
            if conflict.lanes:
                out.append(ckey)
            else:
                self.release_elsewhere(*ckey)
        return out
