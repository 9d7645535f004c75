"""The scheduler façade: events in (submit, cancel, complete), decisions out.

``Scheduler`` is what callers hold. Its state and the moves its operations share are
``state.State``'s; what a shared store says of the rest of the fleet is ``shared.Shared``'s,
which it inherits; the answers to questions are ``inspect.py``'s, and what comes first is
``policy.py``'s.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from ..errors import ConfigurationError, DuplicateJob, SchedulerError, UnknownJobType
from . import inspect
from .allocation import Allocation
from .costs import UNLIMITED, KeyState
from .inspect import Why
from .jobs import ELSEWHERE, Job, Lane
from .keys import out_of_rate
from .policy import conflict_held, goes_before, key_blocks, select
from .shared import Shared
from .state import _INF, _NUMBER, _type_of
from .tenants import tenant_name
from .types import (
    Admission,
    CancelOutcome,
    ExpectedStart,
    JobState,
    JobType,
    JobView,
    KeyPolicies,
    PriorityOutcome,
    Release,
    Snapshot,
    check_priority,
)

__all__ = ["Scheduler"]


class Scheduler(Shared):
    """Fair dispatch of jobs over a fixed number of slots, with no I/O.

    Args:
        config: Capacity, tier caps, the estimate's ``alpha`` and the cost lifecycle.
        clock: The only source of time.
        types: Job types to register at once (more may be registered later).

    Example:
        >>> from celery_fair.core import JobType, Scheduler, SchedulerConfig, SimClock
        >>> s = Scheduler(SchedulerConfig(capacity=1), SimClock(), [JobType("clone", priority=8)])
        >>> s.submit("a1", "clone", "linux", fairness_key="alice")
        >>> s.submit("b1", "clone", "git", fairness_key="bob")
        >>> [a.uid for a in s.schedule()]
        ['a1']
        >>> s.complete("a1", elapsed=5.0).estimate
        2.2
    """

    # -- configuration -----------------------------------------------------------------

    def now(self) -> float:
        """The time by the core's clock: what a job submitted now arrives at."""
        return self._clock.now()

    @property
    def types(self) -> dict[str, JobType]:
        return {name: lane.type for name, lane in self._lanes.items()}

    def type_of(self, name: str) -> JobType:
        """The job type ``name`` (``KeyError`` if none): ``types[name]`` without building
        the dictionary. O(1)."""
        return self._lanes[name].type

    @property
    def capacity(self) -> int:
        return self._capacity

    def set_capacity(self, capacity: int) -> None:
        """Change the number of global slots (the worker follows its pool's size).

        Lowering it below the number of running jobs admits nothing until enough finish.
        """
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
            raise ConfigurationError(f"capacity must be an int >= 0, got {capacity!r}")
        self._capacity = capacity
        self._keys.reshare_due = self._keys.sharing

    # -- events in ---------------------------------------------------------------------

    def submit(
        self,
        uid: Hashable,
        type: str,
        job_id: str | None = None,
        fairness_key: str = "",
        *,
        arrival: float | None = None,
        cost: float | None = None,
        priority: int | None = None,
    ) -> None:
        """Add a pending job. O(log n).

        Args:
            uid: The job's identity (``types.JobUid``), unique among the jobs held here.
            type: The name of a registered job type.
            job_id: The resource the job works on. ``None`` means none: the estimate is
                then learned per type, and the job conflicts with nothing.
            fairness_key: Who asked; ``""`` for background work.
            arrival: When the job arrived (default: now). Ties in cost go to earlier arrivals.
            cost: If given, the estimate to charge at admission instead of the learned one.
            priority: The job's own priority, if not its type's: it is then ordered, aged and
                counted against the tier cap at that priority, and against its type's cap.
                Either is lowered to its key's ``max_priority`` if above it
                (``priority_for``).

        Raises:
            DuplicateJob: ``uid`` is already pending or running.
            UnknownJobType: ``type`` was never registered.
            SchedulerError: ``priority`` (or ``cost``, ``arrival``) is not valid.
        """
        if uid in self._jobs:
            raise DuplicateJob(f"job {uid!r} is already held by the scheduler")
        lane = self._lanes.get(type)
        if lane is None:
            raise UnknownJobType(f"unknown job type {type!r}")
        if cost is not None and not (_type_of(cost) in _NUMBER and 0 <= cost < _INF):
            raise SchedulerError(f"job {uid!r}: cost must be a finite number >= 0, got {cost!r}")
        check_priority(priority)
        now = self._clock.now()
        if arrival is None:
            arrival = now
        elif not (_type_of(arrival) in _NUMBER and -_INF < arrival < _INF):
            raise SchedulerError(f"job {uid!r}: arrival must be a finite number, got {arrival!r}")
        self._maintain(now)
        key = self._key(fairness_key)
        if key.max_priority is not None:
            priority = _bounded(lane, key.max_priority, priority)
        if priority is not None:
            lane = self._lane_at(lane, priority)
        tenant = key.tenant
        if tenant is not None:
            if tenant.pending == 0 and tenant.running == 0:
                assert self._tenants is not None
                self._tenants.activate(tenant)
            tenant.pending += 1
        if key.pending == 0 and key.running == 0:
            self._accounts.activate(key)
        if self._keys.sharing:
            self._keys.demand_moved(key, 1)
        group = lane.type.conflict_group
        ckey = (group, job_id) if group and job_id is not None else None
        job = Job(uid, lane, job_id, key, arrival, next(self._seq), cost, ckey)
        self._jobs[uid] = job
        key.pending += 1
        lane.pending += 1
        lane.tier.pending += 1
        self._pending += 1
        self._enqueue(job)

    def priority_for(self, type: str, fairness_key: str, priority: int | None) -> int | None:
        """The own priority ``submit`` gives a job of ``type`` asked at ``priority``
        (``None``: its type's): ``priority``, or its key's ``max_priority`` if the job would
        be above it. O(1) for a known key, O(patterns) otherwise.

        Raises:
            UnknownJobType: ``type`` was never registered.
        """
        lane = self._lanes.get(type)
        if lane is None:
            raise UnknownJobType(f"unknown job type {type!r}")
        bound = self._keys.bound(fairness_key)
        return priority if bound is None else _bounded(lane, bound, priority)

    def priority_of(self, uid: Hashable) -> int | None:
        """The own priority job ``uid`` has here (pending or running): its tier's, which its
        key's ``max_priority`` may have lowered from what was asked; ``None`` for a job not
        held here. O(1)."""
        job = self._jobs.get(uid)
        return None if job is None else job.lane.tier.priority

    def cancel(self, uid: Hashable) -> CancelOutcome:
        """Withdraw a pending job. O(1)."""
        job = self._jobs.get(uid)
        if job is None:
            return CancelOutcome.UNKNOWN
        if job.state is JobState.RUNNING:
            return CancelOutcome.RUNNING
        now = self._clock.now()
        self._maintain(now)
        self._unqueue(job)
        del self._jobs[uid]
        lane = job.lane
        lane.pending -= 1
        lane.tier.pending -= 1
        self._pending -= 1
        key = job.key
        key.pending -= 1
        if key.tenant is not None:
            key.tenant.pending -= 1
        if self._keys.sharing:
            self._keys.demand_moved(key, -1)
        self._went_idle(key, now)
        return CancelOutcome.CANCELLED

    def reprioritize(self, uid: Hashable, priority: int | None) -> PriorityOutcome:
        """Give pending job ``uid`` the priority ``priority`` (``None``: its type's own).

        It is then ordered, aged and counted against the tier cap at ``priority`` (its type's
        cap still counts it), or at its key's ``max_priority`` if that is lower. It is taken
        as new: it arrives now, so its aging starts over
        and it goes behind the jobs its key already has waiting at that priority. Whoever
        asks for this asks for that job to move, and the clock that raised it is the one it
        had at its old priority. O(log n) (a tier's first side lane: O(tiers)).

        Returns:
            ``OK`` when it was moved, ``RUNNING`` when it already runs, ``UNKNOWN`` when the
            core holds no such job.

        Raises:
            SchedulerError: ``priority`` is not a positive int.
        """
        check_priority(priority)
        now = self._clock.now()
        self._maintain(now)
        job = self._jobs.get(uid)
        if job is None:
            return PriorityOutcome.UNKNOWN
        if job.state is JobState.RUNNING:
            return PriorityOutcome.RUNNING
        old = job.lane
        if job.key.max_priority is not None:
            priority = _bounded(old, job.key.max_priority, priority)
        self._move(job, self._lane_at(old, priority), now, next(self._seq))
        return PriorityOutcome.OK

    def complete(self, uid: Hashable, elapsed: float) -> Release:
        """A running job finished after ``elapsed`` seconds: learn from it and release it.

        The estimate for its ``(type, job_id)`` becomes
        ``alpha * elapsed + (1 - alpha) * previous``. O(log n).

        Raises:
            UnknownJob: ``uid`` is not a running job.
        """
        if not (_type_of(elapsed) in _NUMBER and 0 <= elapsed < _INF):
            raise SchedulerError(
                f"job {uid!r}: elapsed must be a finite number >= 0, got {elapsed!r}"
            )
        return self._release(uid, elapsed)

    def release(self, uid: Hashable, *, refund: bool = False) -> Release:
        """Release a running job without learning from it (e.g. revoked, or its worker lost).

        With ``refund``, the job never ran (admitted, then revoked or expired before it
        began): what its key was charged for it goes back (no lower than 0), so a key is not
        penalised for work that never happened.

        Raises:
            UnknownJob: ``uid`` is not a running job.
        """
        job = self._jobs.get(uid)
        released = self._release(uid, None)
        if refund and job is not None:
            key = job.key
            if self._accounts.keys.get(key.name) is key:
                if job.charge:
                    self._set_acc(key, max(0.0, key.acc - job.charge))
                if key.rate is not None:
                    self._keys.refund_rate(key, job.estimate)
            tenant = key.tenant
            if tenant is not None:
                tenants = self._tenants
                assert tenants is not None
                if tenants.keys.get(tenant.name) is tenant:
                    if job.tcharge:
                        self._set_acc(tenant, max(0.0, tenant.acc - job.tcharge))
                    if tenant.rate is not None:
                        self._keys.refund_rate(tenant, job.estimate)
            if job.lane.rate is not None:
                self._keys.refund_rate(job.lane, job.estimate)
        return released

    # -- policies: weights, caps and pauses by key, pauses by type --------------------

    @property
    def key_policies(self) -> KeyPolicies:
        return self._keys.policies

    def set_key_policies(self, policies: KeyPolicies) -> None:
        """Replace the policies by fairness key; every known key follows at once (a key
        below a raised cap runs again, a key above a lowered one runs nothing more until it
        is below it). O(keys · patterns), plus O(q log n) for each key that unblocks.

        A key whose ``max_priority`` falls has its pending jobs above it lowered to it, each
        keeping its place in its key's order (its arrival); one raised lifts none of them.
        O(pending jobs of those keys · log n), once per change."""
        before = {key: key.max_priority for key in self._accounts.keys.values() if key.pending}
        self._age(self._clock.now())
        self._keys.set_policies(policies)
        self._woken_by()
        fell = [
            key
            for key, was in before.items()
            if key.max_priority is not None and (was is None or key.max_priority < was)
        ]
        if fell:
            self._lower(fell)

    def _lower(self, keys: list[KeyState]) -> None:
        """Move the pending jobs of ``keys`` whose priority is above their key's bound down
        to it. O(their pending jobs · log n)."""
        for key in keys:
            bound = key.max_priority
            assert bound is not None
            above = [
                job
                for kq in key.queues or ()
                if kq.owner.lane.tier.priority > bound
                for job in kq.entries()
            ]
            for job in above:
                self._move(job, self._lane_at(job.lane, bound), job.arrival, job.seq)

    def key_terms(self, fairness_key: str) -> tuple[int | None, float]:
        """``fairness_key``'s cap (``None``: none) and weight, as its policy gives them.
        O(1) for a known key, O(patterns) otherwise."""
        return self._keys.terms(fairness_key)

    def tenant_terms(self, fairness_key: str) -> tuple[str, int | None, float] | None:
        """With two-level keys, ``fairness_key``'s tenant, the tenant's cap (``None``: none)
        and weight, as its policy gives them; ``None`` with flat keys. O(1) for a known
        tenant, O(patterns) otherwise."""
        return self._keys.tenant_terms(fairness_key)

    def key_rate(self, fairness_key: str) -> tuple[float, float, bool] | None:
        """``fairness_key``'s rate (per second), bucket size and whether a start charges its
        estimate (``per = "cost"``), as its policy gives them; ``None`` without a rate. O(1)
        for a known key, O(patterns) otherwise."""
        return self._keys.rate_terms(fairness_key)

    def tenant_rate(self, fairness_key: str) -> tuple[float, float, bool] | None:
        """With two-level keys, the rate terms (as ``key_rate``) of ``fairness_key``'s tenant:
        one bucket that every start of any of the tenant's keys pays; ``None`` with flat keys
        or a tenant without a rate. O(1) for a known tenant, O(patterns) otherwise."""
        return self._keys.tenant_rate_terms(fairness_key)

    def type_rate(self, type: str) -> tuple[float, float, bool] | None:
        """Job type ``type``'s rate (per second), bucket size and whether a start charges its
        estimate, as declared; ``None`` without a rate or for a type not registered. O(1)."""
        lane = self._lanes.get(type)
        if lane is None or lane.rate is None:
            return None
        return lane.rate, lane.burst, lane.per_cost

    def key_limits(self) -> dict[str, int]:
        """The cap of every known key that has one. O(keys)."""
        return self._keys.limits()

    def counted_keys(self) -> set[str]:
        """The known keys whose jobs on other workers matter here: those with a cap or a
        minimum of slots. O(keys)."""
        return self._keys.counted()

    def tenant_limits(self) -> dict[str, int]:
        """The cap of every known tenant that has one (two-level keys). O(tenants)."""
        tenants = self._tenants
        if tenants is None:
            return {}
        return {n: t.limit for n, t in tenants.keys.items() if t.limit != UNLIMITED}

    def counted_tenants(self) -> set[str]:
        """As ``counted_keys``, the known tenants with a cap or a minimum (two-level keys).
        O(tenants)."""
        tenants = self._tenants
        if tenants is None:
            return set()
        return {n for n, t in tenants.keys.items() if t.limit != UNLIMITED or t.min_slots}

    def allocation(self) -> Allocation:
        """How many of this scheduler's slots each key with work would get by its policy
        (core/allocation.py): minimums, then weights, clamped by caps and demand (running
        plus pending jobs; none while paused). A view for metrics and inspection, computed
        when asked: O(k log k) for the k keys with work, never part of a decision."""
        return self._keys.allocation(self._capacity)

    def redistributed(self, slots: dict[str, int]) -> float:
        """The slots ``slots`` (``allocation().slots``) gives keys beyond their weighted share:
        what keys that cannot use theirs left to the others (``allocation.redistributed``).
        O(k)."""
        return self._keys.redistributed(self._capacity, slots)

    def running_by_key(self) -> dict[str, int]:
        """Admitted, not yet released jobs of each key that has some. O(keys)."""
        return {name: k.running for name, k in self._accounts.keys.items() if k.running}

    def pending_levels(self) -> dict[int, int]:
        """Pending jobs by effective priority now (an urgent job at the level it rose to).
        O(pending jobs)."""
        self._look()
        out: dict[int, int] = {}
        for job in self._jobs.values():
            if job.state is JobState.PENDING:
                level = job.lane.effective(job)[0]
                out[level] = out.get(level, 0) + 1
        return out

    def _look(self) -> None:
        """Bring the order up to now for a look at it (aging, and shares)."""
        self._age(self._clock.now())
        if self._keys.reshare_due:
            self._keys.reshare(self._capacity)

    def next_refill(self) -> float | None:
        """When the next key or job type out of its rate refills to a start (``None``: none
        is out of its rate). O(1) amortised."""
        due = self._keys.next_wake()
        return None if due == _INF else due

    def pause_key(self, fairness_key: str) -> None:
        """Run nothing more of ``fairness_key`` until ``resume_key``: its pending jobs stay,
        in order, and cost no decision anything. Jobs already running go on. O(1)."""
        self._age(self._clock.now())
        self._keys.pause_key(fairness_key, True)

    def resume_key(self, fairness_key: str) -> None:
        """Undo ``pause_key``. O(q log n), q the key queues of the key."""
        self._age(self._clock.now())
        self._keys.pause_key(fairness_key, False)

    def pause_tenant(self, tenant: str) -> None:
        """With two-level keys, run nothing more of any of ``tenant``'s keys until
        ``resume_tenant``, as ``pause_key`` for each (their jobs do not age meanwhile). A
        tenant not known yet is paused when it appears; with flat keys, nothing runs under
        this name as a tenant. O(1)."""
        self._age(self._clock.now())
        self._keys.pause_tenant(tenant, True)

    def resume_tenant(self, tenant: str) -> None:
        """Undo ``pause_tenant``. O(q log n), q the key queues of the tenant's keys."""
        self._age(self._clock.now())
        self._keys.pause_tenant(tenant, False)

    @property
    def paused_tenants(self) -> frozenset[str]:
        """The paused tenants (``pause_tenant``)."""
        return frozenset(self._keys.paused_tenants)

    def pause_type(self, type: str) -> None:
        """Run no more jobs of ``type`` until ``resume_type``; a decision skips its lane as it
        skips a full one. O(1).

        Raises:
            UnknownJobType: ``type`` was never registered.
        """
        self._pause_type(type, True)

    def resume_type(self, type: str) -> None:
        """Undo ``pause_type``. O(1)."""
        self._pause_type(type, False)

    def _pause_type(self, type: str, paused: bool) -> None:
        lane = self._lanes.get(type)
        if lane is None:
            raise UnknownJobType(f"unknown job type {type!r}")
        self._age(self._clock.now())
        self._keys.pause_type(lane, paused, self._all_lanes(), self._conflicts)

    @property
    def paused(self) -> tuple[frozenset[str], frozenset[str]]:
        """The paused fairness keys and job types."""
        return frozenset(self._keys.paused_keys), frozenset(self._keys.paused_types)

    # -- decisions out -----------------------------------------------------------------

    def next_admission(self) -> Admission | None:
        """Admit the first admissible job in dispatch order, if any.

        Amortised O(tiers + lanes of a tier + log n); it does not grow with blocked jobs.
        """
        now = self._clock.now()
        self._maintain(now)
        keys = self._keys
        if keys.reshare_due:
            keys.reshare(self._capacity)
        job = select(
            self._tiers,
            self._capacity - self._running,
            self._agenda.active or self._by_key,
            self._urgent_passes,
        )
        if job is None:
            self._starved = self._pending > 0 and self._running < self._capacity
            return None
        self._starved = False
        return self._admit(job, now)

    def schedule(self) -> list[Admission]:
        """Admit jobs one at a time until nothing more is admissible."""
        now = self._clock.now()
        self._maintain(now)
        keys = self._keys
        if keys.reshare_due:
            keys.reshare(self._capacity)
        tiers = self._tiers
        compare_all = self._agenda.active or self._by_key
        admitted: list[Admission] = []
        while True:
            job = select(tiers, self._capacity - self._running, compare_all, self._urgent_passes)
            if job is None:
                self._starved = self._pending > 0 and self._running < self._capacity
                return admitted
            admitted.append(self._admit(job, now))

    def next_rise(self) -> float | None:
        """When time alone next changes a decision (``None``: nothing is due): aging raises a
        waiting job's place, or a key out of its rate refills.

        A caller that decides only when jobs come and go should also decide then: a job that
        turns urgent may pass its key's cap, and a key that refilled may run again, so a free
        slot can take them. It may be a little early (the job it was booked for may have
        moved on); a decision then does nothing. O(1) amortised.
        """
        due = self._keys.next_wake()
        if self._agenda.active:
            rise = self._agenda.next_time()
            if rise is not None and rise < due:
                due = rise
        return None if due == _INF else due

    # -- inspection --------------------------------------------------------------------

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def running(self) -> int:
        return self._running

    @property
    def starved(self) -> bool:
        """The last decision left a slot free that no pending job could take: they all wait
        for conflicts or caps (or a cost reset). O(1)."""
        return self._starved

    def by_type(self) -> list[tuple[str, int, int, int]]:
        """(type, priority, pending, running) for each job type. O(types)."""
        return [
            (name, lane.tier.priority, lane.pending, lane.running)
            for name, lane in self._lanes.items()
        ]

    def running_by_tier(self) -> dict[int, int]:
        """Admitted, not yet released jobs by priority (each job's own). O(tiers)."""
        return {t.priority: t.running for t in self._tiers}

    def blocked_counts(self) -> dict[str, int]:
        """Pending jobs by what holds each back now (``BlockReason`` values), and
        ``"admissible"`` for those only waiting for the next decision. A job blocked for
        several reasons counts once, under the one that would still hold it if the others
        went: a pause, its conflict, its key's cap, its type's cap, its tier's cap, then
        every slot being busy. For metrics; O(pending).
        """
        return inspect.blocked_counts(
            self._jobs.values(),
            self._capacity - self._running,
            self._conflicts,
            self._urgent_passes,
        )

    def pending_of(self, fairness_key: str) -> int:
        """How many pending jobs ``fairness_key`` has. O(1)."""
        key = self._accounts.keys.get(fairness_key)
        return 0 if key is None else key.pending

    def pending_keys(self) -> list[str]:
        """The fairness keys that have pending jobs. O(keys)."""
        return [name for name, key in self._accounts.keys.items() if key.pending]

    def pending_tenants(self) -> list[str]:
        """The tenants that have pending jobs (two-level keys; none with flat keys).
        O(tenants)."""
        tenants = self._tenants
        if tenants is None:
            return []
        return [name for name, t in tenants.keys.items() if t.pending]

    def tenant_use(self) -> dict[str, tuple[int, int, float]]:
        """Each tenant with work here (two-level keys; none with flat keys): its running and
        pending jobs and its accumulated cost. O(tenants)."""
        tenants = self._tenants
        if tenants is None:
            return {}
        return {
            name: (t.running, t.pending, t.acc)
            for name, t in tenants.keys.items()
            if t.running or t.pending
        }

    def order_cost(self, fairness_key: str) -> float:
        """The cost that first orders ``fairness_key``'s jobs: its tenant's accumulated cost
        with two-level keys, else its own (0 for a key not known). O(1)."""
        if self._separator is None:
            return self.accumulated_cost(fairness_key)
        return self.tenant_cost(tenant_name(fairness_key, self._separator))

    def read_cost(self, fairness_key: str) -> float:
        """How far behind ``fairness_key``'s jobs are when a worker chooses which queue to read
        next (worker/shard_turns.py): its ``order_cost``, or ``inf`` while the key, or its
        tenant, is out of its rate now. None of its jobs can start until the bucket refills,
        so a message of it read now would only hold a place that another key's could start
        from, however little the key has used. O(1); the clock is read only for a bucket
        that ran out."""
        key = self._accounts.keys.get(fairness_key)
        if key is not None and key.limited and out_of_rate(key, self._clock.now()):
            return _INF
        tenants = self._tenants
        if self._separator is not None and tenants is not None:
            tenant = tenants.keys.get(tenant_name(fairness_key, self._separator))
            if tenant is not None and tenant.limited and out_of_rate(tenant, self._clock.now()):
                return _INF
        return self.order_cost(fairness_key)

    def tenant_cost(self, tenant: str) -> float:
        """``tenant``'s accumulated cost here (0 for a tenant not known; two-level keys)."""
        tenants = self._tenants
        state = None if tenants is None else tenants.keys.get(tenant)
        return 0.0 if state is None else state.acc

    def __contains__(self, uid: object) -> bool:
        return uid in self._jobs

    def outranks(
        self, uid: Hashable, admitted: Iterable[Admission], tolerance: float = 0.0
    ) -> bool:
        """Whether pending job ``uid`` goes before admissions of ``admitted`` (admitted, not
        yet started) whose estimates add up to at least ``tolerance``. O(1) per admission.

        ``uid`` goes before an admission when it is urgent and the admission is not (or is,
        but arrived later), when it is of a higher effective priority, or of the same and
        its key, even charged ``uid``'s estimate, has used no more than the admission's key had
        before it was charged. A job ahead by less than that (keys taking turns, whose costs
        differ by less than a job) would move the order by less than one of its own jobs: the
        same slack as admitting a job ahead of a free slot, and not worth undoing an admission
        for. ``tolerance`` (in the estimates' unit) is how much admitted work ``uid`` may wait
        behind before undoing admissions is worth it; with 0, any one is enough.

        Never when ``uid``'s key is at its cap or paused, or its type paused, nor when ``uid``
        cannot be the next of its own: it waits behind an earlier job of its key in its lane
        (which was pending when the admissions were made, or was itself such
        a newcomer), or it waits for a conflict that none of ``admitted`` holds.
        """
        job = self._jobs.get(uid)
        if job is None or job.state is not JobState.PENDING:
            return False
        if job.lane.halted or key_blocks(job):
            return False
        home = job.home
        if home is not None:
            waits_on = home.owner.cl
            if waits_on is None:  # in its lane: behind no earlier job of its key there
                first = home.head(False)
            elif waits_on.conflict.holder is None:  # its conflict is free: as its first waiter
                if waits_on.parked.best(False) is not job:
                    return False
                mine = job.lane.queue.queue_of(job.key)
                first = None if mine is None else mine.head(False)
                if first is not None and (first.arrival, first.seq) > (job.arrival, job.seq):
                    first = None
            else:  # parked on a held conflict, which one of ``admitted`` must hold
                holder = waits_on.conflict.holder
                if holder is ELSEWHERE:
                    return False
                admitted = list(admitted)
                if not any(a.uid == holder.uid for a in admitted):
                    return False
                first = None
            if first is not None and first is not job and not conflict_held(self._conflicts, first):
                return False
        self._age(self._clock.now())
        cost = job.cost
        if cost is None:
            cost = self.estimate(job.lane.type.name, job.job_id)
        return goes_before(job, cost, admitted, self._accounts.keys, tolerance)

    def estimate(self, type: str, job_id: str | None = None) -> float:
        """The current estimate for ``(type, job_id)``."""
        lane = self._lanes.get(type)
        if lane is None:
            raise UnknownJobType(f"unknown job type {type!r}")
        return self._estimates.peek((type, job_id), lane.type.default_cost)

    def type_cost(self, type: str) -> float:
        """What a job of ``type`` costs, as learned: its estimate without a resource, else
        the mean over its resources, else its type's default. O(1)."""
        lane = self._lanes.get(type)
        if lane is None:
            raise UnknownJobType(f"unknown job type {type!r}")
        return self._estimates.guess((type, None), lane.type.default_cost)[0]

    def accumulated_cost(self, fairness_key: str) -> float:
        """The accumulated cost of ``fairness_key`` (0 if unknown or evicted)."""
        key = self._accounts.keys.get(fairness_key)
        return 0.0 if key is None else key.acc

    def status(self, uid: Hashable) -> JobView | None:
        """One job's view, with its place in the queue. O(n) for a pending job."""
        job = self._jobs.get(uid)
        if job is None:
            return None
        self._look()
        if job.state is JobState.RUNNING:
            return self._view(job, None, None)
        return self._view(job, *inspect.place_of(job, self._jobs.values()))

    def expected_wait(self, uid: Hashable, slots: int | None = None) -> float | None:
        """``expected_start(uid, slots).seconds``: seconds until pending job ``uid`` is
        expected to start, ``None`` if it is not pending or the model cannot say. O(n)."""
        start = self.expected_start(uid, slots)
        return None if start is None else start.seconds

    def expected_start(self, uid: Hashable, slots: int | None = None) -> ExpectedStart | None:
        """When pending job ``uid`` is expected to start (``None`` if it is not pending): the
        work ahead of it (what the running jobs have left of their estimates, plus the
        estimates of the pending jobs that come before it) shared by ``slots`` (default: the
        capacity), and no less than the work of its own key's jobs ahead of it at its key's
        share of the slots (its water-filled allocation among the keys with work here, which
        a key cap bounds).

        Each cost is its ``(type, job_id)``'s learned estimate, else its type's learned cost
        over all resources, else the type's ``default_cost`` (``Estimates.guess``), and
        ``from_defaults`` says how much of the work ahead is the default. A job that waits for
        a pause, a type cap or a tier cap has no ``seconds``: it starts when that ends, which
        no estimate measures (``waits_for`` says which).

        A model, not a promise: a newcomer that goes first, a conflict or a cap that keeps a
        slot from the jobs ahead, and estimates that miss move it (docs/operations.md gives
        the error measured). O(n)."""
        job = self._jobs.get(uid)
        if job is None or job.state is not JobState.PENDING:
            return None
        view = self.status(uid)
        assert view is not None
        return inspect.expected_start(
            job,
            view,
            self._jobs.values(),
            self._estimates,
            self._capacity if slots is None else slots,
            self._keys.demands(),
            self._clock.now(),
        )

    def why(self, uid: Hashable) -> Why | None:
        """What holds pending job ``uid`` back now, as values (``inspect.Why``: each blocker
        with its numbers, in ``BLOCK_ORDER``, and how many jobs come before it); ``None`` for a
        job that is not pending here. ``celery_fair.words`` writes it in English. O(n) (it
        counts the jobs before it).
        """
        job = self._jobs.get(uid)
        if job is None or job.state is not JobState.PENDING:
            return None
        view = self.status(uid)
        assert view is not None
        return inspect.why(
            job, view, self._conflicts, self._clock.now(), self._running, self._capacity
        )

    def snapshot(self) -> Snapshot:
        """The whole state, pending jobs in dispatch order with their places. O(n log n)."""
        self._look()
        return inspect.snapshot(
            self._jobs.values(),
            self._clock.now(),
            self._capacity,
            self._running,
            self._pending,
            self._tiers,
            self._lanes,
            self._accounts,
            self._estimates,
            self._conflicts,
            self._urgent_passes,
        )


def _bounded(lane: Lane, bound: int, priority: int | None) -> int | None:
    """A job's own priority in ``lane``'s type asked at ``priority`` (``None``: the type's),
    under its key's ``max_priority`` ``bound``: the one rule of that bound."""
    return bound if (lane.type.priority if priority is None else priority) > bound else priority
