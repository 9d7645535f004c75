"""Learned estimates and accumulated costs, and how both are forgotten.

Estimates: one exponential moving average of observed wall time per ``(type, job_id)``,
``alpha * elapsed + (1 - alpha) * previous``, computed in exactly that form so that every
implementation of the rule rounds the same way. Before any observation the estimate is the
type's ``default_cost``. That is what a key is charged, in Python and in the store's Lua alike.

A forecast (when will a job start: ``Scheduler.expected_start``) guesses better for a resource
never seen: the type's learned cost over all its resources (the mean of the type's learned
estimates, ``Estimates.guess``) before its ``default_cost``, and says which of its costs are
still the default. The guess is never charged, so the store's rule is unchanged.

Accumulated cost: one number per fairness key, the sum of the estimates charged to it at
admission. Three lifecycle options keep the map bounded and fair over time (``CostLifecycle``):
eviction of idle keys after a TTL, a periodic reset of every key to zero, and advancing a key
that becomes active to the minimum of the active keys.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from itertools import count
from typing import TYPE_CHECKING, Any

from .types import CostLifecycle

_INF = float("inf")

UNLIMITED = 1 << 62
"""A cap that is never reached; kept as an int so the hot path compares ints only."""


def cap_left(limit: int, elsewhere: int, paused: bool = False) -> int:
    """What one scheduler may run under a cap of ``limit`` (``UNLIMITED`` stays so) when
    ``elsewhere`` run on other workers: never below 0, and 0 while ``paused``."""
    if paused:
        return 0
    if limit == UNLIMITED:
        return UNLIMITED
    return max(0, limit - elsewhere)


if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["UNLIMITED", "Accounts", "Estimates", "KeyState", "cap_left"]

EstimateKey = tuple[str, "str | None"]


class Estimates:
    """Learned cost per ``(type, job_id)``, with optional eviction of stale entries.

    ``_values`` is ordered by last use (oldest first) whenever ``ttl`` is set, because every
    use moves its entry to the end and the clock never goes back.
    """

    __slots__ = ("_by_type", "_values", "alpha", "ttl")

    def __init__(self, alpha: float, ttl: float | None) -> None:
        self.alpha = alpha
        self.ttl = ttl
        # (type, job_id) -> [estimate, last used]
        self._values: OrderedDict[EstimateKey, list[float]] = OrderedDict()
        # type -> [sum, count] of the estimates in _values whose key's type it is
        self._by_type: dict[str, list[float]] = {}

    def _counted(self, key: EstimateKey, old: float | None, new: float | None) -> None:
        """Keep ``_by_type`` equal to its sentence when ``key``'s value goes from ``old`` to
        ``new`` (``None``: absent). O(1)."""
        totals = self._by_type.get(key[0])
        if totals is None:
            totals = self._by_type[key[0]] = [0.0, 0]
        totals[0] += (new or 0.0) - (old or 0.0)
        totals[1] += (new is not None) - (old is not None)
        if not totals[1]:
            del self._by_type[key[0]]

    def type_mean(self, type: str) -> float | None:
        """The type's learned cost over all its resources: the mean of its learned estimates,
        ``None`` before any. O(1)."""
        totals = self._by_type.get(type)
        return None if totals is None else max(0.0, totals[0] / totals[1])

    def guess(self, key: EstimateKey, default: float) -> tuple[float, bool]:
        """The best forecast of what ``key`` costs, and whether it is ``default`` (nothing of
        its type learned yet): its learned estimate, else its type's learned cost over all
        resources (``type_mean``), else ``default``. Not marked used. O(1)."""
        entry = self._values.get(key)
        if entry is not None:
            return entry[0], False
        mean = self.type_mean(key[0])
        return (default, True) if mean is None else (mean, False)

    def get(self, key: EstimateKey, default: float, now: float) -> float:
        """The estimate for ``key`` (``default`` if never observed); marks it used. O(1)."""
        entry = self._values.get(key)
        if entry is None:
            return default
        if self.ttl is not None:
            entry[1] = now
            self._values.move_to_end(key)
        return entry[0]

    def set(self, key: EstimateKey, value: float, now: float) -> None:
        """Make the estimate for ``key`` ``value``, as if just observed. O(1)."""
        entry = self._values.get(key)
        if entry is None:
            self._values[key] = [value, now]
            self._counted(key, None, value)
            return
        self._counted(key, entry[0], value)
        entry[0] = value
        entry[1] = now
        if self.ttl is not None:
            self._values.move_to_end(key)

    def peek(self, key: EstimateKey, default: float) -> float:
        """The estimate for ``key`` without marking it used. O(1)."""
        entry = self._values.get(key)
        return default if entry is None else entry[0]

    def observe(self, key: EstimateKey, elapsed: float, default: float, now: float) -> float:
        """Fold one observed wall time into the estimate and return the new value. O(1)."""
        alpha = self.alpha
        entry = self._values.get(key)
        if entry is None:
            value = alpha * elapsed + (1 - alpha) * default
            self._values[key] = [value, now]
            self._counted(key, None, value)
            return value
        value = alpha * elapsed + (1 - alpha) * entry[0]
        self._counted(key, entry[0], value)
        entry[0] = value
        entry[1] = now
        if self.ttl is not None:
            self._values.move_to_end(key)
        return value

    def expire(self, now: float) -> int:
        """Drop estimates unused for ``ttl`` seconds; return how many. O(1 + evicted)."""
        ttl = self.ttl
        values = self._values
        if ttl is None or not values:
            return 0
        dropped = 0
        while values:
            key = next(iter(values))
            if values[key][1] + ttl > now:
                break
            self._counted(key, values.pop(key)[0], None)
            dropped += 1
        return dropped

    def next_due(self) -> float:
        """When the next estimate expires, if nothing is used before then. O(1)."""
        if self.ttl is None or not self._values:
            return _INF
        return self._values[next(iter(self._values))][1] + self.ttl

    def items(self) -> Iterator[tuple[EstimateKey, float]]:
        for key, entry in self._values.items():
            yield key, entry[0]

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: object) -> bool:
        return key in self._values


class KeyState:
    """The scheduler's record of one fairness key.

    Invariants (checked by the property tests):
      - ``acc`` is the sum of the estimates charged at each admission of this key's jobs since
        it was created, last reset, or advanced;
      - ``pending`` / ``running`` count this key's jobs in each state;
      - ``rank`` is 0 while the key runs fewer than ``min_slots`` jobs (here and, as a store
        says, elsewhere), else 1 while it runs fewer than ``share`` here, else 2: the order's
        first component within a tier, so a key below its minimum goes before the keys at or
        above theirs, and (with allocation caps) a key below its allocation before the keys
        at or above theirs. ``share`` is the key's allocation, ``UNLIMITED`` without
        allocation caps (so the rank is then 0 or 1), and ``share_frac`` the share before it
        was made whole (``allocation.shares``);
      - ``queues`` lists every key queue (``fairqueue.KeyQueue``) of this key that its keyed
        queue still holds, or is ``None`` when there is none;
      - ``cap`` is what this scheduler may run of the key: its ``limit`` (the policy's
        ``max_concurrency``, ``UNLIMITED`` for none) less what other workers run of it
        (``elsewhere``), and 0 while ``paused``; while ``running >= cap`` the key is *blocked*
        and ``blocked`` lists the key queues taken out of their heaps for it (each with
        ``KeyQueue.blocked`` set), which go back as soon as the key is below its cap again;
      - ``max_priority`` (its policy's, ``None``: none) bounds its pending jobs' own
        priorities, and what aging raises them to short of urgency;
      - with a ``rate`` (its policy's, per second; ``None``: none), ``tokens`` is its bucket's
        level at ``tokens_at`` (core/rates.py), and ``limited`` says it holds less than a start:
        the key starts nothing until the bucket refills (``cap`` is 0, as while ``paused``);
        ``halted`` is ``paused or limited``, what even an urgent job does not pass;
      - with two-level keys (``tenants.py``), ``tenant`` is the state of the key's tenant,
        itself a ``KeyState`` (``is_tenant``) whose ``acc`` sums what its keys' admissions
        charged it (``estimate / tenant weight``), ``pending``/``running`` count its keys'
        jobs, ``cap`` bounds them together, ``queues``/``blocked`` list its tenant queues
        (``fairqueue.KeyedQueue`` with a ``parent``), and ``members`` its active keys' costs
        (the lazy heap ``Accounts`` takes a returning key's floor from, with
        ``advance_idle``).
    """

    __slots__ = (
        "acc",
        "blocked",
        "burst",
        "cap",
        "elsewhere",
        "halted",
        "is_tenant",
        "limit",
        "limited",
        "max_priority",
        "members",
        "min_slots",
        "name",
        "paused",
        "pauses",
        "pending",
        "per_cost",
        "queues",
        "rank",
        "rate",
        "running",
        "share",
        "share_frac",
        "tenant",
        "tokens",
        "tokens_at",
        "usable",
        "weight",
    )

    def __init__(self, name: str, acc: float = 0.0) -> None:
        self.name = name
        self.acc = acc
        self.pending = 0
        self.running = 0
        self.queues: list[Any] | None = None
        self.weight = 1.0
        self.limit = self.cap = UNLIMITED
        self.elsewhere = 0
        self.paused = False
        self.pauses: Any = None  # aging.PauseLog, from its first pause on
        self.blocked: list[Any] | None = None
        self.min_slots = 0
        self.max_priority: int | None = None
        self.rank = 1
        self.share = UNLIMITED
        self.share_frac = 0.0
        self.rate: float | None = None
        self.burst = 1.0
        self.per_cost = False
        self.tokens = 1.0
        self.tokens_at = -_INF
        self.limited = False
        self.halted = False
        # Two-level keys: a key's tenant (a KeyState of its own, ``is_tenant``), and for a
        # tenant the lazy heap of its active keys' costs (``Accounts``, ``advance_idle``).
        self.tenant: KeyState | None = None
        self.is_tenant = False
        self.members: list[tuple[float, int, KeyState]] | None = None
        # With allocation caps, a tenant's keys' rooms summed (``KeyRules.demand_moved``).
        self.usable = 0

    def recap(self) -> None:
        """Compute ``cap`` and ``halted`` again from ``limit``, ``elsewhere``, ``paused`` and
        ``limited``. O(1)."""
        self.halted = halted = self.paused or self.limited
        self.cap = cap_left(self.limit, self.elsewhere, halted)

    def rank_now(self) -> int:
        """0 while the key runs fewer than ``min_slots`` jobs here and elsewhere, else 1 while
        it runs fewer than ``share`` here, else 2."""
        if self.running + self.elsewhere < self.min_slots:
            return 0
        return 1 if self.running < self.share else 2

    def room(self, moved: int = 0) -> int:
        """How many slots the allocation lets the key use: its running and pending jobs (less
        ``moved``, for what it was before they moved), no more than its cap, none while paused
        (``allocation.usable``)."""
        if self.paused:
            return 0
        demand = self.running + self.pending - moved
        return demand if demand < self.limit else self.limit

    @property
    def is_active(self) -> bool:
        return self.pending + self.running > 0

    def __repr__(self) -> str:
        return (
            f"<KeyState {self.name!r} acc={self.acc} pending={self.pending} running={self.running}>"
        )


class Accounts:
    """Fairness keys and their accumulated costs, with the configured lifecycle.

    ``_idle`` holds exactly the keys that are neither pending nor running, ordered by the time
    they became idle (oldest first); ``_active`` (only with ``advance_idle``) is a lazy min-heap
    over active keys whose recorded cost is never above the key's current cost.
    """

    __slots__ = ("_active", "_idle", "_ids", "_next_reset", "keys", "lifecycle")

    def __init__(self, lifecycle: CostLifecycle, now: float) -> None:
        self.lifecycle = lifecycle
        self.keys: dict[str, KeyState] = {}
        self._idle: OrderedDict[str, float] = OrderedDict()
        self._active: list[tuple[float, int, KeyState]] = []
        self._ids = count()
        interval = lifecycle.reset_interval
        self._next_reset = float("inf") if interval is None else now + interval

    def get(self, name: str) -> KeyState:
        """The state of key ``name``, created at zero if unknown; ``activate`` it next. O(1)."""
        ks = self.keys.get(name)
        if ks is None:
            ks = self.keys[name] = KeyState(name)
        return ks

    def activate(self, ks: KeyState) -> None:
        """Called when ``ks`` gets its first pending job while idle. With ``advance_idle`` it
        starts from the least active key's cost (of its tenant's keys, with two-level keys).
        O(log active keys)."""
        self._idle.pop(ks.name, None)
        if self.lifecycle.advance_idle:
            floor = self.min_active(ks.tenant)
            if floor is not None and floor > ks.acc:
                ks.acc = floor
            self._push_active(ks)

    def deactivate(self, ks: KeyState, now: float) -> None:
        """Called when ``ks`` has no pending and no running job any more. O(1)."""
        self._idle[ks.name] = now
        self._idle.move_to_end(ks.name)

    def lowered(self, ks: KeyState) -> None:
        """``ks``'s cost went down: keep the lazy minimum right (entries never above truth)."""
        if self.lifecycle.advance_idle and ks.is_active:
            self._push_active(ks)

    def _push_active(self, ks: KeyState) -> None:
        tenant = ks.tenant
        if tenant is not None:  # two-level keys: among its tenant's keys
            if tenant.members is None:
                tenant.members = []
            heapq.heappush(tenant.members, (ks.acc, next(self._ids), ks))
            if len(tenant.members) > 64 and len(tenant.members) > 4 * (
                tenant.pending + tenant.running + 1
            ):
                self._rebuild_members(tenant)
            return
        heapq.heappush(self._active, (ks.acc, next(self._ids), ks))
        if len(self._active) > 64 and len(self._active) > 4 * (len(self.keys) - len(self._idle)):
            self._rebuild_active()

    def min_active(self, tenant: KeyState | None = None) -> float | None:
        """The smallest accumulated cost among active keys (of ``tenant``'s keys, with
        two-level keys), or ``None``. Amortised O(log n)."""
        heap = self._active if tenant is None else tenant.members
        keys = self.keys
        while heap:
            acc, _, ks = heap[0]
            if not ks.is_active or keys.get(ks.name) is not ks or ks.tenant is not tenant:
                heapq.heappop(heap)
            elif acc != ks.acc:
                heapq.heapreplace(heap, (ks.acc, next(self._ids), ks))
            else:
                return acc
        return None

    def _rebuild_active(self) -> None:
        self._active = self._fresh(self._active)

    def _rebuild_members(self, tenant: KeyState) -> None:
        tenant.members = self._fresh(tenant.members or [])

    def _fresh(self, heap: list[tuple[float, int, KeyState]]) -> list[tuple[float, int, KeyState]]:
        """The active keys of ``heap``, once each, at their true costs. O(len(heap))."""
        seen: set[int] = set()
        fresh = []
        for _, _, ks in heap:
            if ks.is_active and id(ks) not in seen and self.keys.get(ks.name) is ks:
                seen.add(id(ks))
                fresh.append((ks.acc, next(self._ids), ks))
        heapq.heapify(fresh)
        return fresh

    def expire(self, now: float) -> bool:
        """Apply TTL eviction and periodic reset due at ``now``.

        Returns ``True`` when a reset lowered accumulated costs, so that the caller must
        re-order everything it sorted by them. O(1 + evicted), O(keys) on a reset.
        """
        ttl = self.lifecycle.cost_ttl
        idle = self._idle
        if ttl is not None and idle:
            keys = self.keys
            while idle:
                name = next(iter(idle))
                if idle[name] + ttl > now:
                    break
                del idle[name]
                del keys[name]
        if now < self._next_reset:
            return False
        interval = self.lifecycle.reset_interval
        assert interval is not None
        while self._next_reset <= now:
            self._next_reset += interval
        tenants = set()
        for ks in self.keys.values():
            ks.acc = 0.0
            if ks.tenant is not None:
                tenants.add(ks.tenant)
        if self.lifecycle.advance_idle:
            self._rebuild_active()
            for tenant in tenants:
                self._rebuild_members(tenant)
        return True

    def next_due(self) -> float:
        """When the next idle key expires or the next reset falls. O(1)."""
        due = self._next_reset
        ttl = self.lifecycle.cost_ttl
        if ttl is not None and self._idle:
            due = min(due, self._idle[next(iter(self._idle))] + ttl)
        return due

    def costs(self) -> dict[str, float]:
        return {name: ks.acc for name, ks in self.keys.items()}
