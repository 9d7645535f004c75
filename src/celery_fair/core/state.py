"""The scheduler's state, and the moves every event is made of.

``State`` owns the structures (tiers, lanes, jobs, conflicts, keys, estimates, the agenda) and
keeps the sentences stated beside them true; its methods are the steps the public operations
share: admitting a job and releasing it, moving it between pending and running in every count,
charging or refunding its key, running the agenda and the cost lifecycle up to now. It decides
nothing (``policy.py`` does) and answers no question (``inspect.py`` does). Its subclass
``shared.Shared`` takes what a shared store says, and ``scheduler.Scheduler``, the façade,
inherits both.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from itertools import count

from ..errors import ConfigurationError, UnknownJob
from . import inspect
from .aging import Agenda, PauseLog
from .clock import Clock
from .costs import UNLIMITED, Accounts, Estimates, KeyState, cap_left
from .fairqueue import KeyedQueue, discard, park_on, release, rise, take
from .jobs import Conflict, Job, Lane, PendingQueue, SideLane, Tier
from .keys import KeyRules, rerank
from .tenants import TenantedQueue, reposition, tenant_name, unblock
from .types import (
    Admission,
    Aging,
    JobState,
    JobType,
    JobView,
    Release,
    SchedulerConfig,
)

__all__ = ["State"]


class State:
    """The scheduler's structures and the steps its operations share (see the module); made
    with ``Scheduler``'s arguments."""

    def __init__(
        self, config: SchedulerConfig, clock: Clock, types: Iterable[JobType] = ()
    ) -> None:
        self.config = config
        self._clock = clock
        now = clock.now()
        self._capacity = config.capacity
        # _running is the number of admitted, not yet released jobs; _pending of pending ones.
        self._running = 0
        self._pending = 0
        # _starved: the last decision left a slot free that no pending job could take.
        self._starved = False
        self._lanes: dict[str, Lane] = {}
        # _side: the side lanes of types whose jobs were given another priority, by
        # (type, priority) (fairqueue.SideLane), created when first needed.
        self._side: dict[tuple[str, int], SideLane] = {}
        # _tiers holds one Tier per distinct priority of a registered type, highest first.
        self._tiers: list[Tier] = []
        self._jobs: dict[Hashable, Job] = {}
        # _conflicts holds every (group, job_id) that a job holds or that jobs wait for.
        self._conflicts: dict[tuple[str, str], Conflict] = {}
        # _elsewhere holds exactly the conflicts whose ``elsewhere`` flag is set.
        self._elsewhere: dict[tuple[str, str], Conflict] = {}
        self._seq = count()
        self._tokens = count(1)
        self._estimates = Estimates(config.alpha, config.lifecycle.estimate_ttl)
        self._accounts = Accounts(config.lifecycle, now)
        # Two-level keys: the separator, and the tenants' states and costs, with the same
        # lifecycle as the keys' (tenants.py).
        self._separator = config.key_separator
        self._tenants = None if self._separator is None else Accounts(config.lifecycle, now)
        # _due: no cost or estimate expires, no reset falls, and no key out of its rate
        # refills (keys.py, ``KeyRules.wake``) before this time.
        self._due = self._accounts.next_due()
        # The time of the operation in progress, and when aging next moves a key queue up.
        self._agenda = Agenda(now)
        # The keys' terms by name: policies, pauses, counts elsewhere, shares (keys.py).
        self._keys = KeyRules(
            self._accounts,
            config.keys,
            config.allocation_caps,
            self._agenda,
            self._separator,
            self._tenants,
        )
        # Priority orders only a key's own jobs (``Place``): every decision compares lanes.
        self._by_key = config.priority_scope == "key"
        # Whether urgent jobs pass what other workers run against tier and type caps (the
        # store weighs it for them), or must keep within it (a share set while it is away).
        self._urgent_passes = True
        # What other workers run by priority, as a store last said (a new tier starts so).
        self._tiers_elsewhere: dict[int, int] = {}
        for jtype in types:
            self.register_type(jtype)

    def register_type(self, jtype: JobType) -> None:
        """Register a job type. Registering an identical type again is a no-op.

        Raises:
            ConfigurationError: A different type of the same name is already registered.
        """
        lane = self._lanes.get(jtype.name)
        if lane is not None:
            if lane.type != jtype:
                raise ConfigurationError(
                    f"job type {jtype.name!r} is declared twice with different options: "
                    f"{lane.type} and {jtype}"
                )
            return
        tier = self._tier(jtype.priority)
        lane = Lane(
            jtype,
            tier,
            self._agenda,
            self._queue,
            self._aging_of(jtype),
            self._by_key,
            self._separator is not None,
        )
        if lane.aging is not None:
            self._agenda.active = True
        if jtype.name in self._keys.paused_types:
            lane.paused = True
            lane.pauses = PauseLog()
            lane.pauses.pause(self._clock.now())
            lane.recap()
        tier.lanes.append(lane)
        self._lanes[jtype.name] = lane

    def _tier(self, priority: int) -> Tier:
        """The tier of ``priority``, made (capped by the config) if no lane has it yet."""
        tier = next((t for t in self._tiers if t.priority == priority), None)
        if tier is None:
            cap = self.config.tier_cap(priority)
            tier = Tier(priority, UNLIMITED if cap is None else cap)
            self._tiers.append(tier)
            self._tiers.sort(key=lambda t: -t.priority)
        return tier

    def _queue(self, lane: Lane) -> PendingQueue:
        """A new queue of pending jobs for ``lane``, seeing this scheduler's conflicts: two
        levels deep with two-level keys (``tenants.TenantedQueue``)."""
        if self._separator is not None:
            return TenantedQueue(lane, self._conflicts)
        return KeyedQueue(lane, self._conflicts)

    def _key(self, name: str) -> KeyState:
        """Key ``name``'s state, made and given its terms if new; with two-level keys, linked
        to its tenant's (made too if new). O(1) known, O(patterns) new."""
        accounts = self._accounts
        key = accounts.keys.get(name)
        tenants = self._tenants
        if tenants is None:
            if key is None:
                key = accounts.get(name)
                self._keys.adopt(key)
            return key
        assert self._separator is not None
        tname = tenant_name(name, self._separator)
        tenant = tenants.keys.get(tname)
        if tenant is None:
            tenant = tenants.get(tname)
            self._keys.adopt_tenant(tenant)
        if key is None:
            key = accounts.get(name)
            key.tenant = tenant
            self._keys.adopt(key)
        elif key.tenant is not tenant:  # its tenant was forgotten while it was idle
            key.tenant = tenant
            self._keys.adopt(key)
        return key

    def _aging_of(self, jtype: JobType) -> Aging | None:
        return jtype.aging if jtype.aging is not None else self.config.aging

    def _lane_at(self, lane: Lane, priority: int | None) -> Lane:
        """``lane``'s type's lane for jobs of ``priority`` (``None``: the type's own): the type's
        lane, or its side lane at that priority (made on first use). O(1), O(tiers) to make."""
        home = lane.home if isinstance(lane, SideLane) else lane
        if priority is None or priority == home.type.priority:
            return home
        side = self._side.get((home.type.name, priority))
        if side is None:
            tier = self._tier(priority)
            tier.elsewhere = n = self._tiers_elsewhere.get(priority, 0)
            tier.cap = cap_left(tier.limit, n)
            side = SideLane(home, tier, self._queue, self._aging_of(home.type))
            if side.aging is not None:
                self._agenda.active = True
            tier.lanes.append(side)
            self._side[(home.type.name, priority)] = side
        return side

    def _all_lanes(self) -> Iterable[Lane]:
        """Every lane: the types' own, then their side lanes."""
        yield from self._lanes.values()
        yield from self._side.values()

    @staticmethod
    def _unqueue(job: Job) -> None:
        """Take pending ``job`` out of wherever it waits. O(1)."""
        discard(job)

    def _enqueue(self, job: Job) -> None:
        """Put pending ``job`` where it waits: on its conflict if that is held (so no decision
        ever has to step over it), else in its lane. O(log n)."""
        ckey = job.ckey
        conflict = None if ckey is None else self._conflicts.get(ckey)
        if conflict is not None and conflict.holder is not None:
            park_on(conflict, job)
        else:
            job.lane.queue.push(job)

    def _move(self, job: Job, lane: Lane, arrival: float, seq: int) -> None:
        """Put pending ``job`` in ``lane`` (another priority of its type) as arrived at
        ``arrival``, ``seq``. O(log n)."""
        old = job.lane
        self._unqueue(job)
        old.tier.pending -= 1
        lane.tier.pending += 1
        # A new record: entries of the old one left behind in its queue stay dead (they would
        # come alive at its old place if the same record came back to the same queue).
        moved = Job(job.uid, lane, job.job_id, job.key, arrival, seq, job.cost, job.ckey)
        self._jobs[job.uid] = moved
        self._enqueue(moved)

    def _admit(self, job: Job, now: float) -> Admission:
        effective, urgent = job.lane.effective(job)
        take(job)
        job.state = JobState.RUNNING
        lane = job.lane
        tier = lane.tier
        key = job.key
        self._start(job, 1)
        if key.rank != 2 and (key.min_slots or key.share != UNLIMITED):
            key.rank = key.rank_now()  # later, if so: entries catch up lazily
        ckey = job.ckey
        if ckey is not None:
            conflict = self._conflicts.get(ckey)
            if conflict is None:
                conflict = self._conflicts[ckey] = Conflict(ckey, self._conflicts)
            conflict.holder = job
        jtype = lane.type
        estimate = job.cost
        if estimate is None:
            estimate = self._estimates.get((jtype.name, job.job_id), jtype.default_cost, now)
        job.estimate = estimate
        weight = key.weight
        job.charge = charge = estimate if weight == 1.0 else estimate / weight
        key.acc += charge
        if key.rate is not None:
            self._keys.charge_rate(key, estimate)
            if key.limited:
                self._woken_by()
        if lane.rate is not None:
            self._keys.charge_rate(lane, estimate)
            if lane.limited:
                self._woken_by()
        tenant = key.tenant
        if tenant is not None:
            self._charge_tenant(job, key, tenant, estimate)
            if tenant.rate is not None:  # one bucket for all its keys' starts
                self._keys.charge_rate(tenant, estimate)
                if tenant.limited:
                    self._woken_by()
        job.token = token = next(self._tokens)
        job.admitted_at = now
        job.effective = (effective, urgent)
        return Admission(
            job.uid,
            jtype.name,
            job.job_id,
            key.name,
            tier.priority,
            estimate,
            token,
            job.arrival,
            now,
            effective,
            urgent,
        )

    @staticmethod
    def _charge_tenant(job: Job, key: KeyState, tenant: KeyState, estimate: float) -> None:
        """``job`` of ``key`` was just admitted (two-level keys): its tenant is charged
        ``estimate / weight`` too (entries catch up lazily)."""
        weight = tenant.weight
        job.tcharge = charge = estimate if weight == 1.0 else estimate / weight
        tenant.acc += charge
        if tenant.rank != 2 and (tenant.min_slots or tenant.share != UNLIMITED):
            tenant.rank = tenant.rank_now()

    def _start(self, job: Job, n: int) -> None:
        """Move ``job`` from pending to running (``n = 1``) or back (``n = -1``) in every count."""
        lane = job.lane
        tier = lane.tier
        key = job.key
        lane.pending -= n
        lane.running += n
        tier.pending -= n
        tier.running += n
        self._pending -= n
        self._running += n
        key.pending -= n
        key.running += n
        tenant = key.tenant
        if tenant is not None:
            tenant.pending -= n
            tenant.running += n

    def _release(self, uid: Hashable, elapsed: float | None) -> Release:
        job = self._jobs.get(uid)
        if job is None or job.state is not JobState.RUNNING:
            raise UnknownJob(f"job {uid!r} is not running")
        now = self._clock.now()
        self._maintain(now)
        del self._jobs[uid]
        lane = job.lane
        lane.running -= 1
        lane.tier.running -= 1
        self._running -= 1
        key = job.key
        key.running -= 1
        if key.blocked is not None and key.running < key.cap:
            unblock(key)
        tenant = key.tenant
        if tenant is not None:
            tenant.running -= 1
            if tenant.blocked is not None and tenant.running < tenant.cap:
                unblock(tenant)
            if tenant.min_slots or tenant.share != UNLIMITED:
                rerank(tenant)
        if self._keys.sharing:
            self._keys.demand_moved(key, -1)
        if key.min_slots or key.share != UNLIMITED:
            rerank(key)
        jtype = lane.type
        ekey = (jtype.name, job.job_id)
        if elapsed is None:
            estimate = self._estimates.peek(ekey, jtype.default_cost)
        else:
            estimate = self._estimates.observe(ekey, elapsed, jtype.default_cost, now)
            self._expiring(self._estimates.ttl, now)
        ckey = job.ckey
        if ckey is not None:
            conflict = self._conflicts.get(ckey)
            if conflict is not None and conflict.holder is job:
                release(conflict)
        self._went_idle(key, now)
        return Release(uid, jtype.name, job.job_id, key.name, elapsed, estimate)

    def _went_idle(self, key: KeyState, now: float) -> None:
        """A job of ``key`` left (ended or cancelled): the key, and with two-level keys its
        tenant, start their idle time if they have no job left. O(1)."""
        if key.pending == 0 and key.running == 0:
            self._accounts.deactivate(key, now)
            self._expiring(self._accounts.lifecycle.cost_ttl, now)
        tenant = key.tenant
        if tenant is not None and tenant.pending == 0 and tenant.running == 0:
            assert self._tenants is not None
            self._tenants.deactivate(tenant, now)
            self._expiring(self._tenants.lifecycle.cost_ttl, now)

    def _set_acc(self, key: KeyState, value: float) -> None:
        """Set a key's accumulated cost, keeping every order that uses it right."""
        old = key.acc
        key.acc = value
        if value < old:  # (a rise is caught up lazily)
            reposition(key)
            accounts = self._tenants if key.is_tenant else self._accounts
            assert accounts is not None
            accounts.lowered(key)

    def _age(self, now: float) -> None:
        """Make ``now`` the time of the operation, and move up the key queues whose heads
        aging has raised by then. O(1) while none is due."""
        agenda = self._agenda
        agenda.now = now
        if agenda.active:
            for kq in agenda.due(now):
                rise(kq)  # type: ignore[arg-type]

    def _maintain(self, now: float) -> None:
        """``_age``, then apply the cost lifecycle due at ``now``. O(1) while nothing is due."""
        self._age(now)
        if now < self._due:
            return
        lowered = self._accounts.expire(now)
        tenants = self._tenants
        if tenants is not None and tenants.expire(now):
            lowered = True
        if lowered:
            self._reorder()
        self._estimates.expire(now)
        self._keys.wake(now)
        self._due = min(
            self._accounts.next_due(), self._estimates.next_due(), self._keys.next_wake()
        )
        if tenants is not None:
            self._due = min(self._due, tenants.next_due())

    def _woken_by(self) -> None:
        """A key or type ran out of its rate: keep ``_due`` no later than its wake. O(1)
        amortised."""
        due = self._keys.next_wake()
        if due < self._due:
            self._due = due

    def _expiring(self, ttl: float | None, now: float) -> None:
        """Something was stamped ``now`` and expires ``ttl`` later: keep ``_due`` no later."""
        if ttl is not None and now + ttl < self._due:
            self._due = now + ttl

    def _reorder(self) -> None:
        """Accumulated costs went down: rebuild every order that used them. O(keys +
        conflict lanes)."""
        for lane in self._all_lanes():
            lane.queue.refresh()
        for conflict in list(self._conflicts.values()):
            for cl in list(conflict.lanes.values()):
                cl.renew()

    def _view(self, job: Job, place: int | None, place_in_key: int | None) -> JobView:
        free = self._capacity - self._running
        return inspect.view(job, place, place_in_key, free, self._conflicts, self._urgent_passes)


# Exact types: bool is an int subclass but not a number of seconds. Comparisons with _INF
# also refuse NaN and infinities.
_NUMBER = (int, float)
_INF = math.inf
_type_of = type  # submit() has a parameter named ``type``
