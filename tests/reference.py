"""A deliberately slow and obvious implementation of the dispatch rule: the tests' oracle.

Every decision sorts every pending job in the stated order and scans every running job. Nothing
is cached or indexed, so there is little room for the subtle bugs the real core could have.
Its own hand-computed tests live in tests/unit/test_reference.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from celery_fair.core.allocation import KeyDemand, allocate
from celery_fair.core.rates import parse_rate


@dataclass
class RefType:
    name: str
    priority: int
    max_concurrency: int | None = None
    conflict_group: str = ""
    default_cost: float = 1.0
    # {"interval": i, "grace": g, "ceiling": c or None, "urgent": u or None}; None: the
    # scheduler's.
    aging: dict | None = None
    # Its rate's terms, as a key's: "10/s" or a number per second, a burst, "job" or "cost".
    rate: object = None
    burst: float = 1
    per: str = "job"


@dataclass
class RefJob:
    ref: object
    type: str
    job_id: str | None
    key: str
    arrival: float
    seq: int
    cost: float | None
    estimate: float = 0.0
    charge: float = 0.0
    effective: tuple[int, bool] = (0, False)
    tcharge: float = 0.0  # what its tenant was charged (two-level keys)
    # Its own priority when not its type's (given at submit, or by reprioritize).
    priority: int | None = None


@dataclass
class RefScheduler:
    capacity: int
    types: dict[str, RefType]
    alpha: float = 0.3
    tier_caps: dict[int, int | None] = field(default_factory=dict)
    cost_ttl: float | None = None
    estimate_ttl: float | None = None
    reset_interval: float | None = None
    advance_idle: bool = False
    start: float = 0.0
    # Policies by key: {name or glob pattern or "*": {"weight": w, "min_slots": m,
    # "max_concurrency": n, "max_priority": p, "rate": r, "burst": b, "per": "job"/"cost"}};
    # exact names first, then patterns in the order given, then "*".
    keys: dict[str, dict] = field(default_factory=dict)
    # Aging for every type that has none of its own, as RefType.aging.
    aging: dict | None = None
    # Each key's allocation (core/allocation.py, tested on its own) is its soft cap.
    allocation_caps: bool = False
    # "global": priority first, then fairness; "key": fairness first, then priority.
    priority_scope: str = "global"
    # Two-level keys (docs/design.md 5g): with a separator, key "acme/alice" belongs to tenant
    # "acme" (the text before the first separator; a key without one is its own tenant). The
    # order serves tenants fairly first, then keys within the tenant; policies named without
    # the separator are the tenants' (weight, min_slots, max_concurrency over its keys,
    # max_priority, rate: one bucket that every start of its keys pays), those with it the
    # keys'; a paused tenant starts none of its keys' jobs. With allocation caps, tenants are
    # allocated the slots first, then each tenant's keys its slots (allocation.two_levels).
    key_separator: str | None = None

    def __post_init__(self) -> None:
        self.pending: list[RefJob] = []
        self.running: list[RefJob] = []
        self.acc: dict[str, float] = {}
        self.idle_since: dict[str, float] = {}
        # The tenants' accumulated costs and idle times, as the keys' (two-level keys).
        self.tacc: dict[str, float] = {}
        self.tidle_since: dict[str, float] = {}
        self.estimates: dict[tuple[str, str | None], float] = {}
        self.estimate_used: dict[tuple[str, str | None], float] = {}
        self.seq = 0
        # What a shared store says other workers run and hold.
        self.elsewhere_tiers: dict[int, int] = {}
        self.elsewhere_types: dict[str, int] = {}
        self.elsewhere_conflicts: set[tuple[str, str]] = set()
        self.elsewhere_keys: dict[str, int] = {}
        # Whether urgent jobs pass the tier and type counts elsewhere (a store's), or keep
        # within them (a share while the store is away).
        self.urgent_passes = True
        self.paused_keys: set[str] = set()
        self.paused_types: set[str] = set()
        self.paused_tenants: set[str] = set()  # (two-level keys)
        self._allocations: tuple[tuple, tuple[dict[str, int], dict[str, int]]] | None = None
        # Every pause so far: (kind, name) -> [[start, end or None], ...].
        self.pause_log: dict[tuple[str, str], list[list]] = {}
        # Every charge to each key's rate bucket, oldest first: (time, amount); a charge given
        # back is a negative amount at the time it was given back.
        self.charges: dict[str, list[tuple[float, float]]] = {}
        # Where a key's bucket history starts, when not full before its first charge: (time,
        # level), set when its rate terms change.
        self.baseline: dict[str, tuple[float, float]] = {}
        # Every charge to each type's rate bucket, as ``charges`` for keys.
        self.type_charges: dict[str, list[tuple[float, float]]] = {}
        # Every charge to each tenant's rate bucket and where its history starts, as
        # ``charges`` and ``baseline`` for keys (two-level keys).
        self.tcharges: dict[str, list[tuple[float, float]]] = {}
        self.tbaseline: dict[str, tuple[float, float]] = {}
        self.next_reset = (
            math.inf if self.reset_interval is None else self.start + self.reset_interval
        )

    # -- lifecycle, applied at the start of every operation --

    def maintain(self, now: float) -> None:
        if self.cost_ttl is not None:
            for key, since in list(self.idle_since.items()):
                if since + self.cost_ttl <= now:
                    del self.idle_since[key]
                    del self.acc[key]
                    self.charges.pop(key, None)  # a key forgotten starts with a full bucket
                    self.baseline.pop(key, None)
            for tenant, since in list(self.tidle_since.items()):
                if since + self.cost_ttl <= now:
                    del self.tidle_since[tenant]
                    del self.tacc[tenant]
                    self.tcharges.pop(tenant, None)  # and its bucket, as a key's
                    self.tbaseline.pop(tenant, None)
        if self.next_reset <= now:
            while self.next_reset <= now:
                self.next_reset += self.reset_interval  # type: ignore[operator]
            for key in self.acc:
                self.acc[key] = 0.0
            for tenant in self.tacc:
                self.tacc[tenant] = 0.0
        if self.estimate_ttl is not None:
            for ekey, used in list(self.estimate_used.items()):
                if used + self.estimate_ttl <= now:
                    del self.estimate_used[ekey]
                    del self.estimates[ekey]

    def active(self, key: str) -> bool:
        return any(j.key == key for j in self.pending + self.running)

    def tenant(self, key: str) -> str:
        """The key's tenant: the text before the first separator, or the key itself."""
        sep = self.key_separator
        return key.split(sep, 1)[0] if sep is not None and sep in key else key

    def tenant_active(self, tenant: str) -> bool:
        return any(self.tenant(j.key) == tenant for j in self.pending + self.running)

    # -- operations --

    def submit(self, ref, type, job_id, key, arrival, cost, now, priority=None):
        self.maintain(now)
        tenant = self.tenant(key)
        if self.key_separator is not None and not self.tenant_active(tenant):
            self.tidle_since.pop(tenant, None)
            self.tacc.setdefault(tenant, 0.0)
            if self.advance_idle:
                others = {self.tenant(j.key) for j in self.pending + self.running}
                if others:
                    floor = min(self.tacc[t] for t in others)
                    if floor > self.tacc[tenant]:
                        self.tacc[tenant] = floor
        if not self.active(key):
            self.idle_since.pop(key, None)
            self.acc.setdefault(key, 0.0)
            if self.advance_idle:
                # a returning key starts from the least active key's cost (of its tenant's
                # keys, with two levels)
                others = {
                    j.key
                    for j in self.pending + self.running
                    if self.tenant(j.key) == tenant or self.key_separator is None
                }
                if others:
                    floor = min(self.acc[k] for k in others)
                    if floor > self.acc[key]:
                        self.acc[key] = floor
        self.pending.append(
            RefJob(
                ref,
                type,
                job_id,
                key,
                arrival,
                self.seq,
                cost,
                priority=self.bounded(type, key, priority),
            )
        )
        self.seq += 1

    def bounded(self, type: str, key: str, priority: int | None) -> int | None:
        """The job's own priority: as asked (``None``: its type's), or its key's
        max_priority if that is lower."""
        bound = self.bound(key)
        asked = self.types[type].priority if priority is None else priority
        return bound if bound is not None and asked > bound else priority

    def set_keys(self, keys: dict[str, dict], now: float = 0.0) -> None:
        """New policies; a pending job above its key's max_priority now is lowered to it,
        keeping its arrival. A key whose rate terms change keeps what its bucket holds now
        (no more than its new burst), and one that loses its rate forgets its bucket."""
        before = {
            key: (self.rate(key), self.bucket(key, now)) for key in self.acc if self.rate(key)
        }
        tbefore = {
            t: (self.tenant_rate(t), self.tenant_bucket(t, now))
            for t in self.tacc
            if self.tenant_rate(t)
        }
        self.keys = keys
        self._allocations = None  # (remembered for the old policies)
        for names, rate, was, charges, baseline in (
            (self.acc, self.rate, before, self.charges, self.baseline),
            (self.tacc, self.tenant_rate, tbefore, self.tcharges, self.tbaseline),
        ):
            for name in names:
                terms = rate(name)
                if terms is None:
                    charges.pop(name, None)
                    baseline.pop(name, None)
                elif name in was and was[name][0] != terms:
                    baseline[name] = (now, min(was[name][1], terms[1]))
                    charges.pop(name, None)
        for job in self.pending:
            bound = self.bound(job.key)
            if bound is not None and self.base(job) > bound:
                job.priority = bound

    def reprioritize(self, ref, priority, now) -> str:
        """A pending job takes ``priority`` and is taken as new: it arrives now."""
        self.maintain(now)
        if any(j.ref == ref for j in self.running):
            return "running"
        for job in self.pending:
            if job.ref == ref:
                job.priority = self.bounded(job.type, job.key, priority)
                job.arrival = now
                job.seq = self.seq
                self.seq += 1
                return "ok"
        return "unknown"

    def bound(self, key: str) -> int | None:
        """The key's max_priority: the lower of its own and its tenant's."""
        bounds = [self.policy(key).get("max_priority")]
        if self.key_separator is not None:
            bounds.append(self.tenant_policy(self.tenant(key)).get("max_priority"))
        return min((b for b in bounds if b is not None), default=None)

    def base(self, job: RefJob) -> int:
        """The job's own priority: the tier it counts against, and where aging starts."""
        return self.types[job.type].priority if job.priority is None else job.priority

    def cancel(self, ref, now) -> bool:
        self.maintain(now)
        for job in self.pending:
            if job.ref == ref:
                self.pending.remove(job)
                self.went_idle(job.key, now)
                return True
        return False

    def policy(self, key: str) -> dict:
        """The key's policy; with two levels, from the entries that name the separator (a key
        without one has none of its own: its tenant's applies)."""
        sep = self.key_separator
        if sep is None:
            return _resolve(key, self.keys)
        if sep not in key:
            return {}
        return _resolve(key, {n: p for n, p in self.keys.items() if sep in n})

    def tenant_policy(self, tenant: str) -> dict:
        """The tenant's policy: from the entries that do not name the separator."""
        sep = self.key_separator
        assert sep is not None
        return _resolve(tenant, {n: p for n, p in self.keys.items() if sep not in n})

    def tier_cap(self, priority: int) -> float:
        cap = self.tier_caps.get(priority, priority)
        return math.inf if cap is None else cap

    def admissible(self, job: RefJob, now: float) -> bool:
        jt = self.types[job.type]
        if len(self.running) >= self.capacity:
            return False
        # An urgent job counts only the jobs running here against its tier's and type's caps:
        # a store weighs the others (and holds the next free slot for it).
        urgent = self.urgent_passes and self.effective(job, now)[1]
        tier = self.base(job)
        same_tier = [r for r in self.running if self.base(r) == tier]
        elsewhere = 0 if urgent else self.elsewhere_tiers.get(tier, 0)
        if len(same_tier) + elsewhere >= self.tier_cap(tier):
            return False
        same_type = [r for r in self.running if r.type == job.type]
        elsewhere = 0 if urgent else self.elsewhere_types.get(job.type, 0)
        if jt.max_concurrency is not None and len(same_type) + elsewhere >= jt.max_concurrency:
            return False
        if job.type in self.paused_types or job.key in self.paused_keys:
            return False
        if self.key_separator is not None and self.tenant(job.key) in self.paused_tenants:
            return False
        if self.rate(job.key) is not None and self.bucket(job.key, now) < 1:
            return False  # out of its rate: not even an urgent job passes
        tenant = self.tenant(job.key)
        if self.tenant_rate(tenant) is not None and self.tenant_bucket(tenant, now) < 1:
            return False  # its tenant is out of its rate, whichever of its keys it is
        if jt.rate is not None and self.type_bucket(job.type, now) < 1:
            return False  # its type is out of its rate, whichever key it is
        key_cap = self.policy(job.key).get("max_concurrency")
        same_key = [r for r in self.running if r.key == job.key]
        if (
            key_cap is not None
            and len(same_key) + self.elsewhere_keys.get(job.key, 0) >= key_cap
            and not self.effective(job, now)[1]  # urgent jobs pass their key's cap
        ):
            return False
        if self.key_separator is not None:  # and its tenant's, over all the tenant's keys
            tenant = self.tenant(job.key)
            tenant_cap = self.tenant_policy(tenant).get("max_concurrency")
            if (
                tenant_cap is not None
                and self.tenant_running(tenant) >= tenant_cap
                and not self.effective(job, now)[1]
            ):
                return False
        if jt.conflict_group and job.job_id is not None:
            if (jt.conflict_group, job.job_id) in self.elsewhere_conflicts:
                return False
            for r in self.running:
                if (
                    r.job_id == job.job_id
                    and self.types[r.type].conflict_group == jt.conflict_group
                ):
                    return False
        return True

    # -- rate limits --

    def rate(self, key: str) -> tuple[float, float, bool] | None:
        """The key's (rate per second, burst, per cost), or None without a rate."""
        policy = self.policy(key)
        if policy.get("rate") is None:
            return None
        return parse_rate(policy["rate"]), policy.get("burst", 1), policy.get("per") == "cost"

    def bucket(self, key: str, now: float) -> float:
        """What the key's bucket holds at ``now``: full (its burst) before any charge, then
        each charge in turn, refilling at the rate in between, never above the burst."""
        rate, burst, _ = self.rate(key)  # type: ignore[misc]
        return _replay(rate, burst, self.baseline.get(key), self.charges.get(key, []), now)

    def tenant_rate(self, tenant: str) -> tuple[float, float, bool] | None:
        """The tenant's (rate per second, burst, per cost), or None: flat keys, or no rate."""
        if self.key_separator is None:
            return None
        policy = self.tenant_policy(tenant)
        if policy.get("rate") is None:
            return None
        return parse_rate(policy["rate"]), policy.get("burst", 1), policy.get("per") == "cost"

    def tenant_bucket(self, tenant: str, now: float) -> float:
        """What the tenant's bucket holds at ``now``, as ``bucket`` for a key."""
        rate, burst, _ = self.tenant_rate(tenant)  # type: ignore[misc]
        return _replay(rate, burst, self.tbaseline.get(tenant), self.tcharges.get(tenant, []), now)

    def type_bucket(self, type: str, now: float) -> float:
        """What the type's bucket holds at ``now``: full before any charge, then each charge
        in turn, refilling at its rate in between, never above its burst (a type's terms do
        not change)."""
        jt = self.types[type]
        return _replay(parse_rate(jt.rate), jt.burst, None, self.type_charges.get(type, []), now)

    def _rated(self) -> tuple[set[str], set[str], set[str]]:
        """The keys, tenants and types that may be out of their rate: those with pending jobs
        and those charged (a key out of its rate stays so until it refills, pending jobs or
        not, as the core's ``next_rise`` counts it)."""
        keys = {j.key for j in self.pending} | set(self.charges)
        tenants = {self.tenant(j.key) for j in self.pending} | set(self.tcharges)
        types = {j.type for j in self.pending} | set(self.type_charges)
        return keys, tenants, types

    def refills(self, now: float) -> list[float]:
        """When each key, tenant or type out of its rate at ``now`` refills to a start."""
        keys, tenants, types = self._rated()
        times = []
        for key in keys:
            terms = self.rate(key)
            if terms is not None and (level := self.bucket(key, now)) < 1:
                times.append(now + (1 - level) / terms[0])
        for tenant in tenants:
            terms = self.tenant_rate(tenant)
            if terms is not None and (level := self.tenant_bucket(tenant, now)) < 1:
                times.append(now + (1 - level) / terms[0])
        for type in types:
            jt = self.types[type]
            if jt.rate is not None and (level := self.type_bucket(type, now)) < 1:
                times.append(now + (1 - level) / parse_rate(jt.rate))
        return times

    def refill_due(self, now: float) -> bool:
        """Whether a key, tenant or type waits for its bucket to refill to a start."""
        return bool(self.refills(now))

    def charge_rate(self, job: RefJob, now: float, sign: float = 1.0) -> None:
        terms = self.rate(job.key)
        if terms is not None:
            amount = job.estimate if terms[2] else 1.0
            self.charges.setdefault(job.key, []).append((now, sign * amount))
        tenant = self.tenant(job.key)
        terms = self.tenant_rate(tenant)
        if terms is not None:
            amount = job.estimate if terms[2] else 1.0
            self.tcharges.setdefault(tenant, []).append((now, sign * amount))
        jt = self.types[job.type]
        if jt.rate is not None:
            amount = job.estimate if jt.per == "cost" else 1.0
            self.type_charges.setdefault(job.type, []).append((now, sign * amount))

    # -- pauses and aging --

    def pause(self, kind: str, name: str, paused: bool, now: float) -> None:
        names = {"key": self.paused_keys, "type": self.paused_types}.get(kind, self.paused_tenants)
        log = self.pause_log.setdefault((kind, name), [])
        if paused and name not in names:
            names.add(name)
            log.append([now, None])
        elif not paused and name in names:
            names.discard(name)
            log[-1][1] = now

    def wait(self, job: RefJob, now: float) -> float:
        """Time since arrival, less the time its key, its tenant or its type was paused in
        between."""
        spans = []
        whose = [("key", job.key), ("type", job.type)]
        if self.key_separator is not None:
            whose.append(("tenant", self.tenant(job.key)))
        for kind, name in whose:
            for start, end in self.pause_log.get((kind, name), []):
                end = now if end is None else end
                lo, hi = max(start, job.arrival), min(end, now)
                if hi > lo:
                    spans.append((lo, hi))
        paused = 0.0
        reach = -math.inf
        for lo, hi in sorted(spans):
            lo = max(lo, reach)
            if hi > lo:
                paused += hi - lo
            reach = max(reach, hi)
        return (now - job.arrival) - paused

    def aging_of(self, type: str) -> dict | None:
        own = self.types[type].aging
        return own if own is not None else self.aging

    def effective(self, job: RefJob, now: float) -> tuple[int, bool]:
        """(effective priority, urgent), as ``aged`` says, and no higher than the key's
        max_priority unless urgent."""
        level, urgent = self.aged(job, now)
        bound = self.bound(job.key)
        if not urgent and bound is not None and level > bound:
            level = max(self.base(job), bound)
        return level, urgent

    def aged(self, job: RefJob, now: float) -> tuple[int, bool]:
        """(level, urgent): base + floor((wait - grace) / interval) once the wait passes
        grace, capped by the ceiling (never below base); urgent once it has risen above base
        to the urgent threshold or beyond."""
        base = self.base(job)
        aging = self.aging_of(job.type)
        if aging is None:
            return base, False
        wait = self.wait(job, now)
        grace = aging.get("grace", 0)
        level = base
        if wait > grace:
            level = base + math.floor((wait - grace) / aging["interval"])
            if aging.get("ceiling") is not None:
                level = max(base, min(level, aging["ceiling"]))
        urgent = aging.get("urgent") is not None and level > base and level >= aging["urgent"]
        return level, urgent

    def next_rise(self, now: float) -> float | None:
        """The next time any pending job's effective priority or urgency changes (frozen
        while paused), or a key, tenant or type out of its rate refills to a start."""
        times = self.refills(now)
        for job in self.pending:
            aging = self.aging_of(job.type)
            if aging is None or job.key in self.paused_keys or job.type in self.paused_types:
                continue
            if self.key_separator is not None and self.tenant(job.key) in self.paused_tenants:
                continue
            base = self.base(job)
            level, urgent = self.aged(job, now)
            ceiling = aging.get("ceiling")
            if urgent or (ceiling is not None and level + 1 > ceiling):
                continue
            target = aging.get("grace", 0) + (level + 1 - base) * aging["interval"]
            bound = self.bound(job.key)
            if bound is not None and level >= bound:  # it moves again when urgent, if ever
                threshold = aging.get("urgent")
                if threshold is None or max(threshold, base + 1) > (ceiling or math.inf):
                    continue
                target = (
                    aging.get("grace", 0) + (max(threshold, base + 1) - base) * aging["interval"]
                )
            times.append(now + (target - self.wait(job, now)))
        return min(times, default=None)

    def allocation(self) -> dict[str, int]:
        """Each key's slots by its policy, among the keys with jobs (none while paused); with
        two-level keys, of its tenant's slots (``allocations``)."""
        return self.allocations()[1]

    def allocations(self) -> tuple[dict[str, int], dict[str, int]]:
        """Each tenant's slots (two-level keys; else none) and each key's. Flat: the keys
        share the capacity by their policies. Two levels: each tenant's demand is what its
        keys can use (each key's jobs, no more than its cap; none while paused), summed, and
        none while the tenant is paused; the tenants share the capacity, then each tenant's
        keys share its slots."""
        # The same state gives the same answer: remembered while nothing it reads changes
        # (an order of n jobs asks it 2n times).
        state = (
            self.capacity,
            frozenset(self.paused_keys),
            frozenset(self.paused_tenants),
            tuple(j.key for j in self.pending),
            tuple(j.key for j in self.running),
        )
        if self._allocations is not None and self._allocations[0] == state:
            return self._allocations[1]
        self._allocations = (state, self._allocate())
        return self._allocations[1]

    def _allocate(self) -> tuple[dict[str, int], dict[str, int]]:
        demand: dict[str, int] = {}
        for j in self.pending + self.running:
            demand[j.key] = demand.get(j.key, 0) + 1
        keys = {}
        for key, n in demand.items():
            p = self.policy(key)
            keys[key] = KeyDemand(
                p.get("weight", 1),
                p.get("min_slots", 0),
                p.get("max_concurrency"),
                0 if key in self.paused_keys else n,
            )
        if self.key_separator is None:
            return {}, allocate(self.capacity, keys).slots
        by_tenant: dict[str, dict[str, KeyDemand]] = {}
        for key, d in keys.items():
            by_tenant.setdefault(self.tenant(key), {})[key] = d
        tenants = {}
        for tenant, own in by_tenant.items():
            p = self.tenant_policy(tenant)
            can = sum(min(d.demand, d.cap if d.cap is not None else d.demand) for d in own.values())
            tenants[tenant] = KeyDemand(
                p.get("weight", 1),
                p.get("min_slots", 0),
                p.get("max_concurrency"),
                0 if tenant in self.paused_tenants else can,
            )
        tenant_slots = allocate(self.capacity, tenants).slots
        key_slots: dict[str, int] = {}
        for tenant, own in by_tenant.items():
            key_slots.update(allocate(tenant_slots.get(tenant, 0), own).slots)
        return tenant_slots, key_slots

    def rank(self, key: str) -> int:
        """0 while the key runs fewer jobs (here and elsewhere) than its min_slots, else 1;
        with allocation caps, 2 once it runs its allocation here."""
        here = sum(1 for r in self.running if r.key == key)
        if here + self.elsewhere_keys.get(key, 0) < self.policy(key).get("min_slots", 0):
            return 0
        if self.allocation_caps and here >= self.allocation().get(key, 0):
            return 2
        return 1

    def tenant_running(self, tenant: str) -> int:
        """The jobs of the tenant's keys running here and, as a store says, elsewhere."""
        here = sum(1 for r in self.running if self.tenant(r.key) == tenant)
        return here + sum(n for k, n in self.elsewhere_keys.items() if self.tenant(k) == tenant)

    def tenant_rank(self, tenant: str) -> int:
        """0 while the tenant runs fewer jobs than its min_slots, else 1; with allocation
        caps, 2 once it runs its allocation here."""
        if self.tenant_running(tenant) < self.tenant_policy(tenant).get("min_slots", 0):
            return 0
        here = sum(1 for r in self.running if self.tenant(r.key) == tenant)
        if self.allocation_caps and here >= self.allocations()[0].get(tenant, 0):
            return 2
        return 1

    def order(self, job: RefJob, now: float = 0.0) -> tuple:
        level, urgent = self.effective(job, now)
        if urgent:  # before everything that is not, oldest first
            return (-math.inf, 0, 0.0, job.arrival, job.seq)
        fair: tuple = (self.rank(job.key), self.acc[job.key])
        if self.key_separator is not None:  # the tenant first, then the key within it
            tenant = self.tenant(job.key)
            fair = (self.tenant_rank(tenant), self.tacc[tenant], *fair)
        if self.priority_scope == "key":  # the key first, then priority within it
            return (*fair, -level, job.arrival, job.seq)
        return (-level, *fair, job.arrival, job.seq)

    def next_admission(self, now) -> RefJob | None:
        self.maintain(now)
        for job in sorted(self.pending, key=lambda j: self.order(j, now)):
            if self.admissible(job, now):
                self.pending.remove(job)
                self.running.append(job)
                jt = self.types[job.type]
                ekey = (job.type, job.job_id)
                if job.cost is not None:
                    job.estimate = job.cost
                else:
                    job.estimate = self.estimates.get(ekey, jt.default_cost)
                    if ekey in self.estimates:
                        self.estimate_used[ekey] = now
                weight = self.policy(job.key).get("weight", 1)
                job.charge = job.estimate if weight == 1 else job.estimate / weight
                job.effective = self.effective(job, now)
                self.acc[job.key] += job.charge
                if self.key_separator is not None:
                    tenant = self.tenant(job.key)
                    tweight = self.tenant_policy(tenant).get("weight", 1)
                    job.tcharge = job.estimate if tweight == 1 else job.estimate / tweight
                    self.tacc[tenant] += job.tcharge
                self.charge_rate(job, now)
                return job
        return None

    def schedule(self, now) -> list[RefJob]:
        out = []
        while (job := self.next_admission(now)) is not None:
            out.append(job)
        return out

    def complete(self, ref, elapsed, now, refund=False) -> None:
        self.maintain(now)
        job = next(j for j in self.running if j.ref == ref)
        self.running.remove(job)
        if refund and job.key in self.acc:  # it never ran: its charges go back
            self.acc[job.key] = max(0.0, self.acc[job.key] - job.charge)
            self.charge_rate(job, now, -1.0)
        tenant = self.tenant(job.key)
        if refund and tenant in self.tacc:
            self.tacc[tenant] = max(0.0, self.tacc[tenant] - job.tcharge)
        if elapsed is not None:
            jt = self.types[job.type]
            ekey = (job.type, job.job_id)
            previous = self.estimates.get(ekey, jt.default_cost)
            self.estimates[ekey] = self.alpha * elapsed + (1 - self.alpha) * previous
            self.estimate_used[ekey] = now
        self.went_idle(job.key, now)

    def went_idle(self, key: str, now: float) -> None:
        """After a job left: its key, and its tenant, start their idle time if they have no
        job left."""
        if not self.active(key):
            self.idle_since[key] = now
        tenant = self.tenant(key)
        if self.key_separator is not None and not self.tenant_active(tenant):
            self.tidle_since[tenant] = now

    # -- what a shared store says --

    def revert(self, ref, now: float = 0.0) -> None:
        job = next(j for j in self.running if j.ref == ref)
        self.running.remove(job)
        self.pending.append(job)
        self.acc[job.key] = self.acc[job.key] - job.charge
        if self.key_separator is not None:
            self.tacc[self.tenant(job.key)] -= job.tcharge
        self.charge_rate(job, now, -1.0)
        bound = self.bound(job.key)
        if bound is not None and self.base(job) > bound:  # it fell while the job ran
            job.priority = bound

    def set_accumulated(self, key: str, value: float) -> None:
        if key in self.acc:
            self.acc[key] = value

    def set_estimate(self, type: str, job_id: str | None, value: float, now: float) -> None:
        self.estimates[(type, job_id)] = value
        self.estimate_used[(type, job_id)] = now


def _replay(
    rate: float,
    burst: float,
    baseline: tuple[float, float] | None,
    charges: list[tuple[float, float]],
    now: float,
) -> float:
    """A bucket's level at ``now``, replayed: full (``burst``) or ``baseline`` (time, level)
    at first, then each charge in turn (a negative one gives back), refilling at ``rate`` in
    between, never above ``burst``."""
    level, last = float(burst), None
    if baseline is not None:
        last, level = baseline
    for at, amount in [*charges, (now, 0.0)]:
        if last is not None and at > last:
            level = min(burst, level + (at - last) * rate)
        level = min(burst, level - amount) if amount < 0 else level - amount
        last = at
    return level


def _resolve(name: str, entries: dict[str, dict]) -> dict:
    """The policy for ``name`` among ``entries``: its exact name, else the first glob pattern
    that matches it, in the order given, else ``"*"``, else none."""
    if name in entries:
        return entries[name]
    for pattern, policy in entries.items():
        if pattern != "*" and any(c in pattern for c in "*?[") and fnmatchcase(name, pattern):
            return policy
    return entries.get("*", {})


def reference_simulate(trace: dict) -> list[dict]:
    """The simulator's event rules, written out plainly over ``RefScheduler``."""
    types = {
        name: RefType(
            name,
            spec["priority"],
            spec.get("max_concurrency"),
            spec.get("conflict_group") or "",
            spec.get("default_cost", 1),
            spec.get("aging"),
            spec.get("rate"),
            spec.get("burst") or 1,
            spec.get("per", "job"),
        )
        for name, spec in trace["types"].items()
    }
    life = trace.get("lifecycle", {})
    ref = RefScheduler(
        trace["capacity"],
        types,
        alpha=trace.get("alpha", 0.3),
        tier_caps={int(k): v for k, v in trace.get("tier_caps", {}).items()},
        cost_ttl=life.get("cost_ttl"),
        estimate_ttl=life.get("estimate_ttl"),
        reset_interval=life.get("reset_interval"),
        advance_idle=life.get("advance_idle", False),
        keys=dict(trace.get("keys", {})),
        aging=trace.get("aging"),
        allocation_caps=trace.get("allocation_caps", False),
        priority_scope=trace.get("priority_scope", "global"),
        key_separator=trace.get("key_separator"),
    )
    jobs = trace["jobs"]
    start: dict[int, float] = {}
    effective: dict[int, int] = {}
    finish: dict[int, float] = {}
    arrived: set[int] = set()
    admitted_order: list[int] = []
    # Pauses: every change as (time, pause?, "key", "type" or "tenant", name), in trace order
    # per time.
    # At one time, pauses and resumes apply in the order of the trace's pauses, a pause
    # before its own resume.
    changes = []
    for n, p in enumerate(trace.get("pauses", [])):
        kind = next(k for k in ("key", "type", "tenant") if k in p)
        changes.append(((p["at"], n, 0), True, kind, p[kind]))
        if p.get("until") is not None:
            changes.append(((p["until"], n, 1), False, kind, p[kind]))
    applied: set[int] = set()
    aged = trace.get("aging") is not None or any(
        spec.get("aging") for spec in trace["types"].values()
    )
    rated = any(p.get("rate") is not None for p in trace.get("keys", {}).values()) or any(
        spec.get("rate") is not None for spec in trace["types"].values()
    )
    t = 0.0
    while True:
        times = [j["arrival"] for i, j in enumerate(jobs) if i not in arrived]
        times += [start[i] + jobs[i]["duration"] for i in start if i not in finish]
        if ref.pending:  # a paused job may wait for a resume
            times += [c[0][0] for i, c in enumerate(changes) if i not in applied]
        if not times and not (rated and ref.pending and ref.refill_due(t)):
            break
        # A capped job may turn urgent and pass its key's cap, and a key out of its rate may
        # refill, while nothing else goes on.
        rise = ref.next_rise(t) if (aged or rated) and ref.pending else None
        t = min(times) if rise is None else min([*times, rise])
        for i in admitted_order:
            if i not in finish and start[i] + jobs[i]["duration"] <= t:
                finish[i] = start[i] + jobs[i]["duration"]
                ref.complete(i, jobs[i]["duration"], t)
        due = [(c, i) for i, c in enumerate(changes) if i not in applied and c[0][0] <= t]
        for (_, pause, kind, name), i in sorted(due):
            applied.add(i)
            ref.pause(kind, name, pause, t)
        for i, j in enumerate(jobs):
            if i not in arrived and j["arrival"] <= t:
                arrived.add(i)
                ref.submit(
                    i,
                    j["type"],
                    j.get("job_id"),
                    j.get("fairness_key") or "",
                    j["arrival"],
                    j.get("cost"),
                    t,
                    j.get("priority"),
                )
        for job in ref.schedule(t):
            start[job.ref] = t
            effective[job.ref] = job.effective[0]
            admitted_order.append(job.ref)
    return [
        {"name": j["name"], "start": start.get(i), "finish": finish.get(i)}
        | ({"effective_priority": effective[i]} if i in effective and aged else {})
        for i, j in enumerate(jobs)
    ]
