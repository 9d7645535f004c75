"""The in-memory store: the same contract as Redis, for one worker and for the simulator.

It keeps the state the Redis scripts keep, with the same rules, in plain dicts, and takes its
time from a ``Clock``. Several engines in one process may share one instance, which is how the
simulator and the tests model a fleet without Redis. It never restarts, so its epoch is fixed;
a new instance (a worker restarted alone) starts its fencing tokens above its creation time, as
a Redis store created then would (wire.py, ``TOKEN_LOW_BITS``), so they never go back; its
lane table's versions start at its creation time likewise (wire.py, ``first_lane_version``).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from itertools import count
from typing import Any

from ..core.clock import Clock, WallClock
from ..core.lanes import (
    DEFAULT_LANE_SECONDS,
    GRACE,
    LaneMap,
    LaneTable,
    agreed_size,
    fleet_sizes,
)
from ..core.rates import level_at, may_start, start_charge
from ..core.types import CostLifecycle
from .base import (
    Ask,
    Done,
    Finished,
    Grant,
    Holder,
    PolicyChange,
    Queued,
    QueuedCount,
    Registered,
    Reply,
    Running,
    Submission,
    Tracked,
    Verdict,
    View,
    check_lane_seconds,
    estimate_field,
    lane_sweep,
    rate_after,
    service_rate,
    submission_field,
)
from .wire import first_lane_version, first_token

__all__ = ["MemoryStore"]


@dataclass(slots=True)
class _Admitted:
    """A job the store admitted (or a worker registered again), held under its worker's lease
    until it finishes: the memory store's record of it, as ``{prefix}:jobs`` is Redis's."""

    worker: str
    token: int
    type: str
    priority: int
    conflict: str
    estimate_key: str
    key: str
    default_cost: float
    charged: float  # the cost charged to ``key`` at admission
    since: float = 0.0  # when it was admitted (or registered again)
    rate_charged: float = 0.0  # what its admission took from its key's bucket
    type_charged: float = 0.0  # and from its type's
    tenant: str | None = None  # its key's tenant (two-level keys), and what it was charged
    tenant_charged: float = 0.0
    tenant_rate_charged: float = 0.0  # and what it took from the tenant's bucket


class MemoryStore:
    """Shared state in this process. Arguments as for ``RedisStore``, plus the clock, and
    ``token_base``: the token before the first one (by default ``first_token(clock.now())``,
    as for a Redis store created now)."""

    def __init__(
        self,
        *,
        alpha: float = 0.3,
        lifecycle: CostLifecycle | None = None,
        lease: float = 30.0,
        dedupe: float = 300.0,
        clock: Clock | None = None,
        token_base: int | None = None,
        lane_seconds: float = DEFAULT_LANE_SECONDS,
    ) -> None:
        self.alpha = alpha
        self.lifecycle = lifecycle or CostLifecycle()
        self.lease = float(lease)
        self.dedupe = float(dedupe)
        self.clock = clock or WallClock()
        self.epoch = "memory"
        self._policies: tuple[int, str] = (0, "")
        # The paused keys, types and tenants (update_policies).
        self._paused: tuple[frozenset[str], ...] = (frozenset(), frozenset(), frozenset())
        self.tiers: dict[int, int] = {}
        self.types: dict[str, int] = {}
        self.conflicts: dict[str, str] = {}
        self.jobs: dict[str, _Admitted] = {}
        self.workers: dict[str, float] = {}  # worker -> lease expiry
        self.acc: dict[str, float] = {}
        # fairness key -> (level, when) of its rate's bucket (core/rates.py); absent: full.
        self.buckets: dict[str, tuple[float, float]] = {}
        self.type_buckets: dict[str, tuple[float, float]] = {}  # job type -> the same
        self.tenant_buckets: dict[str, tuple[float, float]] = {}  # tenant -> the same
        self.active: dict[str, int] = {}
        self._idle: OrderedDict[str, float] = OrderedDict()  # key -> idle since, oldest first
        self.est: dict[str, float] = {}
        self._est_used: OrderedDict[str, float] = OrderedDict()
        self._min: list[tuple[float, int, str]] = []  # lazy min-heap over active keys' acc
        # Two-level keys: each tenant's cost, running jobs, idle time and lazy min-heap (as
        # the keys'), and each tenant's lazy min-heap over its active keys' costs.
        self.tacc: dict[str, float] = {}
        self.tactive: dict[str, int] = {}
        self._tidle: OrderedDict[str, float] = OrderedDict()
        self._tmin: list[tuple[float, int, str]] = []
        self._kmin: dict[str, list[tuple[float, int, str]]] = {}
        self._ids = count()
        self._token = first_token(self.clock.now()) if token_base is None else token_base
        self._reset_at: float | None = None
        self._done: OrderedDict[str, float] = OrderedDict()  # tombstone uid -> when, oldest first
        # Urgent jobs' claims: "p:<priority>" or "t:<type>" -> (uid, expiry); see admit.lua.
        self.claims: dict[str, tuple[str, float]] = {}
        # Submissions by idempotency key: submission_field -> (task id, expiry), published
        # and pending (claimed, not yet published).
        self._submitted: dict[str, tuple[str, float]] = {}
        self._pending: dict[str, tuple[str, float]] = {}
        # Tracked submissions (fair_track_submits): task id -> (fairness key, when), oldest
        # first, and how many each key has.
        self._tracked: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._tracked_in_key: dict[str, int] = {}
        # each key's record of tracked jobs ended (base.rate_after), for Queued.rate
        self._rates: dict[str, tuple[float, float, float]] = {}
        # The fleet's lanes (Store.sweep_lanes): the table, each live worker's announcement,
        # and when each live worker that has not announced was first seen so.
        self.lane_seconds = check_lane_seconds(lane_seconds)
        self.lane_table = LaneTable(0, self.lane_seconds, GRACE)
        self.lane_table.version = first_lane_version(self.clock.now())
        self._announced: dict[str, int] = {}
        self._silent: dict[str, float] = {}

    # -- operations ------------------------------------------------------------------------

    def admit(
        self,
        worker: str,
        asks: list[Ask],
        done: list[Done] | None = None,
        watch: list[str] | None = None,
    ) -> Reply:
        now = self.clock.now()
        self._reclaim(now)
        self._maintain(now)
        self.workers[worker] = now + self.lease
        finished = self._finish(done or (), now)
        self._expire_claims(now)
        grants = []
        for a in asks:
            verdict = self._verdict(a, now)
            if verdict is not Verdict.ADMITTED:
                tokens = None if a.rate is None else self._tokens(a, now)
                type_tokens = None if a.type_rate is None else self._type_tokens(a, now)
                acc = self.acc.get(a.fairness_key, 0.0)
                tacc = None if a.tenant is None else self.tacc.get(a.tenant, 0.0)
                ttokens = self._tenant_tokens(a, now)
                grants.append(
                    Grant(a.uid, verdict, 0, None, acc, tokens, type_tokens, tacc, ttokens)
                )
                continue
            est = a.cost
            if est is None:
                learned = self.est.get(a.estimate_key)
                if learned is None:
                    est = a.default_cost
                else:
                    est = learned
                    self._used(a.estimate_key, now)
            k = a.fairness_key
            t = a.tenant
            acc = self.acc.get(k, 0.0)
            if self.lifecycle.advance_idle and k not in self.active:
                low = _least(
                    self._min if t is None else self._kmin.get(t), self.acc, self.active, self._ids
                )
                if low is not None and low > acc:
                    acc = low
            charge = est if a.weight == 1.0 else est / a.weight
            acc = acc + charge
            self.acc[k] = acc
            self._key_active(k, acc, t)
            tacc = None
            tcharge = 0.0
            if t is not None:
                tacc = self.tacc.get(t, 0.0)
                if self.lifecycle.advance_idle and t not in self.tactive:
                    low = _least(self._tmin, self.tacc, self.tactive, self._ids)
                    if low is not None and low > tacc:
                        tacc = low
                tcharge = est if a.tenant_weight == 1.0 else est / a.tenant_weight
                tacc = tacc + tcharge
                self.tacc[t] = tacc
                self._tenant_active(t, tacc)
            self._token += 1
            if a.claim is not None:
                for field in (f"p:{a.priority}", f"t:{a.type}"):
                    if self.claims.get(field, ("",))[0] == a.uid:
                        del self.claims[field]
            self.tiers[a.priority] = self.tiers.get(a.priority, 0) + 1
            self.types[a.type] = self.types.get(a.type, 0) + 1
            if a.conflict:
                self.conflicts[a.conflict] = a.uid
            tokens = None
            rate_charged = 0.0
            if a.rate is not None:
                rate_charged = start_charge(a.per_cost, est)
                tokens = self._tokens(a, now) - rate_charged
                self.buckets[k] = (tokens, now)
            type_tokens = None
            type_charged = 0.0
            if a.type_rate is not None:
                type_charged = start_charge(a.type_per_cost, est)
                type_tokens = self._type_tokens(a, now) - type_charged
                self.type_buckets[a.type] = (type_tokens, now)
            ttokens = self._tenant_tokens(a, now)
            tenant_charged = 0.0
            if ttokens is not None:
                assert t is not None
                tenant_charged = start_charge(a.tenant_per_cost, est)
                ttokens -= tenant_charged
                self.tenant_buckets[t] = (ttokens, now)
            self.jobs[a.uid] = _Admitted(
                worker, self._token, a.type, a.priority, a.conflict, a.estimate_key, k,
                a.default_cost, charge, self.clock.now(), rate_charged, type_charged, t, tcharge,
                tenant_charged,
            )  # fmt: skip
            grants.append(
                Grant(
                    a.uid, Verdict.ADMITTED, self._token, est, acc, tokens, type_tokens, tacc,
                    ttokens,
                )
            )  # fmt: skip
        tiers, types = self._counts()
        return Reply(
            self.epoch,
            finished,
            grants,
            tiers,
            types,
            {c: c in self.conflicts for c in watch or ()},
            len(self.workers),
            {
                a.fairness_key: self.active.get(a.fairness_key, 0)
                for a in asks
                if a.key_cap is not None
            },
            {
                a.tenant: self.tactive.get(a.tenant, 0)
                for a in asks
                if a.tenant is not None and a.tenant_cap is not None
            },
        )

    def finish(self, worker: str, done: list[Done]) -> list[Finished]:
        now = self.clock.now()
        self._maintain(now)
        return self._finish(done, now)

    def _finish(self, done: Iterable[Done], now: float) -> list[Finished]:
        alpha = self.alpha
        out = []
        for d in done:
            job = self.jobs.get(d.uid)
            if job is None or job.token != d.token:
                out.append(Finished(d.uid, False, None))
                continue
            prev = self.est.get(job.estimate_key, job.default_cost)
            value = prev
            if d.elapsed is not None:
                value = alpha * d.elapsed + (1 - alpha) * prev
                self.est[job.estimate_key] = value
                self._used(job.estimate_key, now)
            if d.unstarted and job.key in self.acc:
                self.acc[job.key] = acc = max(0.0, self.acc[job.key] - job.charged)
                if self.lifecycle.advance_idle:  # lower: its lazy entry must not stay above
                    heap = (
                        self._min if job.tenant is None else self._kmin.setdefault(job.tenant, [])
                    )
                    heapq.heappush(heap, (acc, next(self._ids), job.key))
            if d.unstarted and job.tenant is not None and job.tenant in self.tacc:
                self.tacc[job.tenant] = tacc = max(0.0, self.tacc[job.tenant] - job.tenant_charged)
                if self.lifecycle.advance_idle:
                    heapq.heappush(self._tmin, (tacc, next(self._ids), job.tenant))
            if d.unstarted:  # each bucket gets back what the admission took from it
                _give_back(self.buckets, job.key, job.rate_charged)
                _give_back(self.type_buckets, job.type, job.type_charged)
                if job.tenant is not None:
                    _give_back(self.tenant_buckets, job.tenant, job.tenant_rate_charged)
            self._drop(d.uid, job, now)
            if d.final and self.dedupe > 0:
                self._done[d.uid] = now
                self._done.move_to_end(d.uid)
            out.append(Finished(d.uid, True, value))
        return out

    def heartbeat(
        self,
        worker: str,
        conflicts: list[str],
        keys: list[str],
        policies: int = -1,
        tenants: list[str] | None = None,
    ) -> View:
        now = self.clock.now()
        self.workers[worker] = now + self.lease
        reclaimed = self._reclaim(now)
        self._maintain(now)
        mine = sum(1 for job in self.jobs.values() if job.worker == worker)
        self._expire_claims(now)
        tiers, types = self._counts()
        return View(
            self.epoch,
            now,
            mine,
            reclaimed,
            tiers,
            types,
            {c: c in self.conflicts for c in conflicts},
            {k: self.acc.get(k, 0.0) for k in keys},
            len(self.workers),
            {k: self.active[k] for k in keys if k in self.active},
            self._policies[0],
            None if policies == self._policies[0] or not self._policies[1] else self._policies[1],
            {t: self.tacc.get(t, 0.0) for t in tenants or ()},
            {t: self.tactive[t] for t in tenants or () if t in self.tactive},
        )

    def policies(self) -> tuple[int, str]:
        return self._policies

    def claim_submission(
        self, fairness_key: str, idempotency_key: str, task_id: str, seconds: float
    ) -> Submission | None:
        now = self.clock.now()
        name = submission_field(fairness_key, idempotency_key)
        for records, published in ((self._submitted, True), (self._pending, False)):
            held = records.get(name)
            if held is not None and held[1] > now:
                return Submission(held[0], published)
        self._pending[name] = (task_id, now + seconds)
        return None

    def confirm_submission(
        self, fairness_key: str, idempotency_key: str, task_id: str, seconds: float
    ) -> bool:
        now = self.clock.now()
        name = submission_field(fairness_key, idempotency_key)
        pending = self._pending.get(name)
        own = pending is not None and pending[0] == task_id and pending[1] > now
        if own:
            del self._pending[name]
        held = self._submitted.get(name)
        if held is None or held[1] <= now:  # the first published record stays
            self._submitted[name] = (task_id, now + seconds)
        return own

    def forget_submission(self, fairness_key: str, idempotency_key: str, task_id: str) -> None:
        name = submission_field(fairness_key, idempotency_key)
        if self._pending.get(name, ("",))[0] == task_id:
            del self._pending[name]

    def track(
        self,
        fairness_key: str,
        task_id: str,
        *,
        key_limit: int | None = None,
        total_limit: int | None = None,
        seconds: float = 86400.0,
    ) -> QueuedCount:
        now = self.clock.now()
        tracked = self._tracked
        while tracked:  # the entries whose end was never reported lapse
            oldest, (_, at) = next(iter(tracked.items()))
            if at >= now - seconds:
                break
            self._forget_tracked(oldest)  # lapsed: not an end, so no rate
        in_key = self._tracked_in_key.get(fairness_key, 0)
        total = len(tracked)
        if task_id in tracked:
            return QueuedCount(False, in_key, total)
        if key_limit is not None and in_key >= key_limit:
            return QueuedCount(False, in_key, total, "key")
        if total_limit is not None and total >= total_limit:
            return QueuedCount(False, in_key, total, "total")
        tracked[task_id] = (fairness_key, now)
        self._tracked_in_key[fairness_key] = in_key + 1
        return QueuedCount(True, in_key, total)

    def untrack(self, task_ids: Collection[str], *, ended: bool = True) -> int:
        if not ended:
            return sum(self._forget_tracked(task_id) is not None for task_id in task_ids)
        by_key: dict[str, int] = {}
        for task_id in task_ids:
            key = self._forget_tracked(task_id)
            if key is not None:
                by_key[key] = by_key.get(key, 0) + 1
        now = self.clock.now()
        for key, n in by_key.items():
            self._rates[key] = rate_after(self._rates.get(key), n, now)
        return sum(by_key.values())

    def _forget_tracked(self, task_id: str) -> str | None:
        found = self._tracked.pop(task_id, None)
        if found is None:
            return None
        key = found[0]
        left = self._tracked_in_key[key] - 1
        if left:
            self._tracked_in_key[key] = left
        else:
            del self._tracked_in_key[key]
        return key

    def holder(self, conflict: str) -> Holder | None:
        uid = self.conflicts.get(conflict)
        if uid is None:
            return None
        job = self.jobs.get(uid)
        now = self.clock.now()
        if job is None:
            return Holder(uid, "", None)
        return Holder(uid, job.worker, now - job.since)

    def queued(self, task_id: str) -> Queued | None:
        """O(tracked): the in-memory store serves one process, not a fleet's producers."""
        found = self._tracked.get(task_id)
        if found is None:
            return None
        key, at = found
        place = place_in_key = 0
        for other, (other_key, _) in self._tracked.items():
            place += 1
            place_in_key += other_key == key
            if other == task_id:
                break
        rate = service_rate(self._rates.get(key), self.clock.now())
        return Queued(
            key, at, place_in_key, self._tracked_in_key[key], place, len(self._tracked), rate
        )

    def tracked(
        self, fairness_key: str | None = None, limit: int = 100
    ) -> tuple[list[Tracked], int]:
        """O(tracked)."""
        found = [
            Tracked(task_id, key, at)
            for task_id, (key, at) in self._tracked.items()
            if fairness_key is None or key == fairness_key
        ]
        return found[: max(0, limit)], len(found)

    def update_policies(self, change: PolicyChange) -> tuple[int, str]:
        doc, keys, types, tenants = change(self._policies[1])
        self._policies = (self._policies[0] + 1, doc)
        self._paused = (frozenset(keys), frozenset(types), frozenset(tenants))
        return self._policies

    def register(
        self, worker: str, jobs: list[Running], keep: list[str] | None = None
    ) -> Registered:
        now = self.clock.now()
        self.workers[worker] = now + self.lease
        registered = 0
        for j in jobs:
            if j.uid in self.jobs:
                continue
            self.tiers[j.priority] = self.tiers.get(j.priority, 0) + 1
            self.types[j.type] = self.types.get(j.type, 0) + 1
            if j.conflict and j.conflict not in self.conflicts:
                self.conflicts[j.conflict] = j.uid
            self._key_active(j.fairness_key, self.acc.get(j.fairness_key, 0.0), j.tenant)
            if j.tenant is not None:
                self._tenant_active(j.tenant, self.tacc.get(j.tenant, 0.0))
            self._token = max(self._token, j.token)
            self.jobs[j.uid] = _Admitted(
                worker, j.token, j.type, j.priority, j.conflict, j.estimate_key, j.fairness_key,
                j.default_cost, j.estimate, now, tenant=j.tenant, tenant_charged=j.tenant_charge,
            )  # fmt: skip
            registered += 1
        released = 0
        if keep is not None:  # all this worker has: any other job counted under it goes
            known = {j.uid for j in jobs}.union(keep)
            for uid, job in list(self.jobs.items()):
                if job.worker == worker and uid not in known:
                    self._drop(uid, job, now)
                    released += 1
        return Registered(registered, released)

    # -- lanes (Store.lanes ... sweep_lanes: the rule is core/lanes.py's LaneTable) -----------

    def lanes(self, version: int) -> LaneMap | None:
        table = self.lane_table
        return None if table.version == version else table.map()

    def ask_lane(self, fairness_key: str) -> int | None:
        return self.lane_table.ask(fairness_key, self.clock.now())

    def renew_lanes(self, fairness_keys: Collection[str]) -> None:
        self.lane_table.renew(fairness_keys, self.clock.now())

    def sweep_lanes(
        self, worker: str, size: int, looked: Collection[int], empty: Collection[int]
    ) -> None:
        """O(assignments + workers)."""
        seen, found = lane_sweep(size, looked, empty)
        now = self.clock.now()
        self._announced[worker] = size
        live = {w for w, expiry in self.workers.items() if expiry >= now}
        live.add(worker)
        for gone in [w for w in self._announced if w not in live]:
            del self._announced[gone]
        table = self.lane_table
        table.resize(agreed_size(fleet_sizes(live, self._announced, self._silent, now)), now)
        table.sweep(found, seen, now)

    # -- inspection --------------------------------------------------------------------------

    def estimate(self, type: str, job_id: str | None, default: float) -> float:
        return self.est.get(estimate_field(type, job_id), default)

    def accumulated_cost(self, fairness_key: str) -> float:
        return self.acc.get(fairness_key, 0.0)

    def close(self) -> None:
        pass

    # -- internals ---------------------------------------------------------------------------

    def _verdict(self, a: Ask, now: float) -> Verdict:
        # order: see Store.admit (store/base.py); this store never restarts, so never RECOVERING
        if a.uid in self.jobs:
            return Verdict.RUNNING
        if self.dedupe > 0 and a.uid in self._done:
            return Verdict.DONE
        if (
            a.fairness_key in self._paused[0]
            or a.type in self._paused[1]
            or (a.tenant is not None and a.tenant in self._paused[2])
        ):
            return Verdict.PAUSED
        tier = f"p:{a.priority}"
        if (
            a.tier_cap is not None
            and self.tiers.get(a.priority, 0) + self._claimed(tier, a.uid) >= a.tier_cap
        ):
            self._claim(tier, a, now)
            return Verdict.TIER_CAP
        jtype = f"t:{a.type}"
        if (
            a.type_cap is not None
            and self.types.get(a.type, 0) + self._claimed(jtype, a.uid) >= a.type_cap
        ):
            self._claim(jtype, a, now)
            return Verdict.TYPE_CAP
        if a.key_cap is not None and self.active.get(a.fairness_key, 0) >= a.key_cap:
            return Verdict.KEY_CAP
        if (
            a.tenant is not None
            and a.tenant_cap is not None
            and self.tactive.get(a.tenant, 0) >= a.tenant_cap
        ):
            return Verdict.TENANT_CAP
        if a.rate is not None and not may_start(self._tokens(a, now)):
            return Verdict.RATE_LIMIT
        if a.type_rate is not None and not may_start(self._type_tokens(a, now)):
            return Verdict.RATE_LIMIT
        ttokens = self._tenant_tokens(a, now)
        if ttokens is not None and not may_start(ttokens):
            return Verdict.RATE_LIMIT
        if a.conflict and a.conflict in self.conflicts:
            return Verdict.CONFLICT
        return Verdict.ADMITTED

    def _tokens(self, a: Ask, now: float) -> float:
        """The level of ``a``'s key's bucket at ``now`` (core/rates.py)."""
        assert a.rate is not None
        return _level(self.buckets.get(a.fairness_key), now, a.rate, a.burst)

    def _type_tokens(self, a: Ask, now: float) -> float:
        """The level of ``a``'s type's bucket at ``now`` (core/rates.py)."""
        assert a.type_rate is not None
        return _level(self.type_buckets.get(a.type), now, a.type_rate, a.type_burst)

    def _tenant_tokens(self, a: Ask, now: float) -> float | None:
        """The level of ``a``'s tenant's bucket at ``now`` (``None``: no tenant, or no rate)."""
        if a.tenant is None or a.tenant_rate is None:
            return None
        return _level(self.tenant_buckets.get(a.tenant), now, a.tenant_rate, a.tenant_burst)

    def _claimed(self, field: str, uid: str) -> int:
        """1 if another urgent job's claim holds a slot of ``field``, else 0."""
        held = self.claims.get(field)
        return 1 if held is not None and held[0] != uid else 0

    def _claim(self, field: str, a: Ask, now: float) -> None:
        """``a``, urgent, was refused for ``field``'s cap: hold its next free slot for it,
        unless another job's claim holds it."""
        if a.claim is not None and not self._claimed(field, a.uid):
            self.claims[field] = (a.uid, now + a.claim)

    def _expire_claims(self, now: float) -> None:
        for field, (_, expiry) in list(self.claims.items()):
            if expiry <= now:
                del self.claims[field]

    def _counts(self) -> tuple[dict[int, int], dict[str, int]]:
        """The running counts by tier and type, each claimed slot counted as taken."""
        tiers = dict(self.tiers)
        types = dict(self.types)
        for field in self.claims:
            if field.startswith("p:"):
                priority = int(field[2:])
                tiers[priority] = tiers.get(priority, 0) + 1
            else:
                types[field[2:]] = types.get(field[2:], 0) + 1
        return tiers, types

    def _key_active(self, k: str, acc: float, tenant: str | None) -> None:
        self.active[k] = self.active.get(k, 0) + 1
        self._idle.pop(k, None)
        if self.lifecycle.advance_idle:
            heap = self._min if tenant is None else self._kmin.setdefault(tenant, [])
            heapq.heappush(heap, (acc, next(self._ids), k))

    def _tenant_active(self, t: str, tacc: float) -> None:
        self.tactive[t] = self.tactive.get(t, 0) + 1
        self._tidle.pop(t, None)
        if self.lifecycle.advance_idle:
            heapq.heappush(self._tmin, (tacc, next(self._ids), t))

    def _drop(self, uid: str, job: _Admitted, now: float) -> None:
        del self.jobs[uid]
        _decrement(self.tiers, job.priority)
        _decrement(self.types, job.type)
        if job.conflict and self.conflicts.get(job.conflict) == uid:
            del self.conflicts[job.conflict]
        _went_idle(self.active, job.key, self._idle, now)
        if job.tenant is not None:
            _went_idle(self.tactive, job.tenant, self._tidle, now)

    def _reclaim(self, now: float) -> int:
        dead = [w for w, expiry in self.workers.items() if expiry < now]
        if not dead:
            return 0
        n = 0
        for uid, job in list(self.jobs.items()):
            if job.worker in dead:
                self._drop(uid, job, now)
                n += 1
        for w in dead:
            del self.workers[w]
        return n

    def _used(self, field: str, now: float) -> None:
        self._est_used[field] = now
        self._est_used.move_to_end(field)

    def _maintain(self, now: float) -> None:
        life = self.lifecycle
        if life.cost_ttl is not None:
            _expire(self._idle, self.acc, now - life.cost_ttl, self.buckets)
            _expire(self._tidle, self.tacc, now - life.cost_ttl, self.tenant_buckets)
        if life.estimate_ttl is not None:
            _expire(self._est_used, self.est, now - life.estimate_ttl)
        if self.dedupe > 0:
            _expire(self._done, {}, now - self.dedupe)
        if life.reset_interval is not None:
            if self._reset_at is None:
                self._reset_at = now + life.reset_interval
            elif now >= self._reset_at:
                while self._reset_at <= now:
                    self._reset_at += life.reset_interval
                # (idle keys and tenants keep their idle time: their buckets expire with it)
                self.acc = dict.fromkeys(self.active, 0.0)
                self._min = [(0.0, next(self._ids), k) for k in self.active]
                self.tacc = dict.fromkeys(self.tactive, 0.0)
                self._tmin = [(0.0, next(self._ids), t) for t in self.tactive]
                self._kmin = {
                    t: [(0.0, next(self._ids), k) for _, _, k in heap if k in self.active]
                    for t, heap in self._kmin.items()
                }


def _give_back(buckets: dict[str, tuple[float, float]], name: str, amount: float) -> None:
    """Give ``name``'s bucket in ``buckets`` back ``amount``, if it still has one."""
    held = buckets.get(name)
    if amount and held is not None:
        buckets[name] = (held[0] + amount, held[1])


def _least(
    heap: list[tuple[float, int, str]] | None,
    costs: dict[str, float],
    active: dict[str, int],
    ids: Iterator[int],
) -> float | None:
    """The least cost in ``costs`` of a name of ``heap`` (a lazy min-heap: ``_min`` and
    ``_kmin``'s over keys, ``_tmin`` over tenants) that runs a job (``active``)."""
    while heap:
        acc, _, k = heap[0]
        if k not in active:
            heapq.heappop(heap)
        elif acc != costs.get(k, 0.0):
            heapq.heapreplace(heap, (costs.get(k, 0.0), next(ids), k))
        else:
            return acc
    return None


def _went_idle(
    active: dict[str, int],
    name: str,
    idle: OrderedDict[str, float],
    now: float,
) -> None:
    """A running job of key or tenant ``name`` ended: one fewer runs, and with none left its
    idle time starts (its cost, if any, and its bucket expire with it)."""
    left = active[name] - 1
    if left <= 0:
        del active[name]
        idle[name] = now
        idle.move_to_end(name)
    else:
        active[name] = left


def _decrement(counts: dict[Any, int], name: object) -> None:
    left = counts[name] - 1
    if left <= 0:
        del counts[name]
    else:
        counts[name] = left


def _expire(
    since: OrderedDict[str, float], values: dict[str, Any], cutoff: float, *also: dict[str, Any]
) -> None:
    """Forget the entries of ``values`` (and of ``also``) whose time in ``since`` (oldest
    first) is <= cutoff."""
    while since:
        name = next(iter(since))
        if since[name] > cutoff:
            break
        del since[name]
        values.pop(name, None)
        for more in also:
            more.pop(name, None)


def _level(held: tuple[float, float] | None, now: float, rate: float, burst: float) -> float:
    """A bucket's level at ``now``: as ``held`` (level, when) refilled, or full if never
    charged (core/rates.py)."""
    return burst if held is None else level_at(held[0], held[1], now, rate, burst)
