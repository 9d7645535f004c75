"""Fairness keys' terms: policies (weight, cap, minimum), pauses, counts elsewhere, shares.

``KeyRules`` holds what is set by key name (the policies, the paused keys and types, what other
workers run of each key) and gives each ``KeyState`` its terms from them: when the key appears,
and again when a term changes. A key's terms move its place in the order (its *rank*, from its
minimum and share) and whether it may run (its *cap*); every change here keeps the pending
index right at once (``fairqueue``: ``reposition``, ``unblock``). The
allocation (``allocation.shares``) is computed again only when a key's demand crossed its share
(``reshare_due``), before the next decision. What a term means for admission is
``policy.py``'s to say; this module only keeps the terms and their indexes true.
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import count
from typing import TYPE_CHECKING

from ..errors import ConfigurationError
from .aging import Agenda, PauseLog
from .allocation import Allocation, KeyDemand, redistributed, shares, two_levels, usable
from .costs import UNLIMITED, Accounts, KeyState
from .fairqueue import resume_aging
from .rates import level_at, may_start, refill_at, start_charge
from .tenants import reposition, resume, tenant_name, unblock
from .types import DEFAULT_KEY_POLICY, KeyPolicies, KeyPolicy, lower_bound

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from .jobs import Conflict, ConflictKey, Lane

    Bucketed = KeyState | Lane  # what has a rate's bucket: a key, or a type's lane

__all__ = ["KeyRules", "limits_changed", "out_of_rate", "pause_lane", "rerank"]

_INF = float("inf")
_ids = count()


def out_of_rate(holder: Bucketed, now: float) -> bool:
    """Whether ``holder``'s bucket (a key's, a tenant's or a type's lane's) lets none of its
    jobs start at ``now``, refilled since it was last booked. O(1)."""
    rate = holder.rate
    if rate is None:
        return False
    return not may_start(level_at(holder.tokens, holder.tokens_at, now, rate, holder.burst))


class KeyRules:
    """The terms of every fairness key, by name, and the keys that follow them.

    Args:
        accounts: The known keys (``Accounts.keys``) whose ``KeyState`` this keeps.
        policies: The policies by key.
        sharing: Whether allocation caps are on (``SchedulerConfig.allocation_caps``).
        agenda: The time of the operation in progress, and whether anything ages.
        separator: With two-level keys, the key separator (``SchedulerConfig``), and
            ``tenants`` the known tenants, whose terms this keeps too: a tenant's from the
            policies named without the separator, a key's from those named with it
            (``KeyPolicies.levels``).
    """

    __slots__ = (
        "accounts",
        "agenda",
        "elsewhere",
        "levels",
        "paused_keys",
        "paused_tenants",
        "paused_types",
        "pauses",
        "policies",
        "reshare_due",
        "separator",
        "sharing",
        "tenant_elsewhere",
        "tenants",
        "wakes",
    )

    def __init__(
        self,
        accounts: Accounts,
        policies: KeyPolicies,
        sharing: bool,
        agenda: Agenda,
        separator: str | None = None,
        tenants: Accounts | None = None,
    ) -> None:
        self.accounts = accounts
        self.agenda = agenda
        self.policies = policies
        self.separator = separator
        self.tenants = tenants
        self.levels = None if separator is None else policies.levels(separator)
        # What other workers run of each tenant's keys together, by tenant (two levels).
        self.tenant_elsewhere: dict[str, int] = {}
        # Keys and types paused by name (a key not known yet is paused when it appears), and
        # what other workers run of each key (a shared store's count, none listed as 0).
        self.paused_keys: set[str] = set()
        self.paused_types: set[str] = set()
        self.paused_tenants: set[str] = set()  # (two-level keys; pauses keyed ("tenant", name))
        self.elsewhere: dict[str, int] = {}
        # When each key ever paused was paused, by name (aging does not count that time); a
        # tenant's under ("tenant", name).
        self.pauses: dict[str | tuple[str, str], PauseLog] = {}
        # Allocation caps: each key's allocation is its soft cap (its ``share``), computed
        # again before the next decision once ``reshare_due`` (see ``demand_moved``).
        self.sharing = sharing
        self.reshare_due = sharing
        # The keys and types out of their rate, each booked for when its bucket lets it start
        # again: (time, id, key or type's lane), lazily (one charged or refunded since finds
        # its own time).
        self.wakes: list[tuple[float, int, Bucketed]] = []

    def key_policy(self, name: str) -> KeyPolicy:
        """Key ``name``'s own policy; with two-level keys, from the entries that hold the
        separator, and the default one for a key without it (its tenant's terms apply to
        it: ``tenant_policy``). O(1) for an exact name, O(patterns) otherwise."""
        if self.levels is None:
            return self.policies.for_key(name)
        separator = self.separator
        assert separator is not None
        if separator not in name:
            return DEFAULT_KEY_POLICY
        return self.levels[1].for_key(name)

    def tenant_policy(self, name: str) -> KeyPolicy:
        """Tenant ``name``'s policy (two-level keys): from the entries without the separator."""
        assert self.levels is not None
        return self.levels[0].for_key(name)

    def bound(self, name: str) -> int | None:
        """Key ``name``'s ``max_priority``: its own, or with two-level keys the lower of its
        own and its tenant's. O(1) known, O(patterns) otherwise."""
        key = self.accounts.keys.get(name)
        if key is not None:
            return key.max_priority
        return self.policies.bound(name, self.separator)

    def adopt_tenant(self, tenant: KeyState) -> None:
        """Give ``tenant`` its policy and count elsewhere (new, or after a change): its weight,
        minimum, cap over all its keys, ``max_priority`` for all its jobs and rate, one
        bucket that every start of any of its keys pays."""
        policy = self.tenant_policy(tenant.name)
        tenant.is_tenant = True
        tenant.weight = float(policy.weight)
        tenant.min_slots = policy.min_slots
        tenant.max_priority = policy.max_priority
        cap = policy.max_concurrency
        tenant.limit = UNLIMITED if cap is None else cap
        tenant.elsewhere = self.tenant_elsewhere.get(tenant.name, 0)
        tenant.paused = tenant.name in self.paused_tenants
        tenant.pauses = self.pauses.get(("tenant", tenant.name))
        was_limited = tenant.limited
        self._rate_terms(tenant, policy.rate, policy.bucket, policy.per == "cost")
        limits_changed(tenant)
        self.reshare_due = self.sharing
        refilled = was_limited and not tenant.limited and tenant.blocked is not None
        if refilled and self.agenda.active:
            resume(tenant)  # refilled at its cap: its urgent heads pass the cap again

    def adopt(self, key: KeyState) -> None:
        """Give ``key`` its policy, pause and count elsewhere (new, or after a change); with
        two-level keys, its tenant first (``key.tenant``, adopted)."""
        name = key.name
        policy = self.key_policy(name)
        key.weight = float(policy.weight)
        key.min_slots = policy.min_slots
        bound = key.max_priority
        key.max_priority = policy.max_priority
        if key.tenant is not None:
            key.max_priority = lower_bound(key.max_priority, key.tenant.max_priority)
        cap = policy.max_concurrency
        key.limit = UNLIMITED if cap is None else cap
        key.paused = name in self.paused_keys
        key.pauses = self.pauses.get(name)
        key.elsewhere = self.elsewhere.get(name, 0)
        was_limited = key.limited
        self._rate_terms(key, policy.rate, policy.bucket, policy.per == "cost")
        limits_changed(key)
        self.reshare_due = self.sharing
        refilled = was_limited and not key.limited and key.blocked is not None
        if (bound != key.max_priority or refilled) and self.agenda.active:
            # Its aged heads stood at the old bound: a raised one lets them rise at once
            # (fresh entries and bookings), a lowered one puts them lower; urgent heads of a
            # key no longer out of its rate pass its cap again. O(q log n).
            resume_aging(key)

    def set_policies(self, policies: KeyPolicies) -> None:
        """Replace the policies; every known key follows at once. O(keys · patterns), plus
        O(q log n) for each key that unblocks."""
        if not isinstance(policies, KeyPolicies):
            raise ConfigurationError(f"expected KeyPolicies, got {policies!r}")
        self.policies = policies
        if self.separator is not None:
            self.levels = policies.levels(self.separator)
            assert self.tenants is not None
            for tenant in list(self.tenants.keys.values()):
                self.adopt_tenant(tenant)
        for key in list(self.accounts.keys.values()):
            self.adopt(key)

    def terms(self, name: str) -> tuple[int | None, float]:
        """``name``'s cap (``None``: none) and weight. O(1) known, O(patterns) otherwise."""
        key = self.accounts.keys.get(name)
        if key is not None:
            return (None if key.limit == UNLIMITED else key.limit), key.weight
        policy = self.key_policy(name)
        return policy.max_concurrency, float(policy.weight)

    def tenant_terms(self, name: str) -> tuple[str, int | None, float] | None:
        """With two-level keys, key ``name``'s tenant, its cap (``None``: none) and weight;
        ``None`` with flat keys. O(1) known, O(patterns) otherwise."""
        separator = self.separator
        if separator is None:
            return None
        assert self.tenants is not None
        tenant = tenant_name(name, separator)
        known = self.tenants.keys.get(tenant)
        if known is not None:
            return tenant, (None if known.limit == UNLIMITED else known.limit), known.weight
        policy = self.tenant_policy(tenant)
        return tenant, policy.max_concurrency, float(policy.weight)

    def rate_terms(self, name: str) -> tuple[float, float, bool] | None:
        """``name``'s rate per second, bucket size and whether a start charges its estimate;
        ``None`` without a rate. O(1) known, O(patterns) otherwise."""
        return _rate_of(self.accounts.keys.get(name), lambda: self.key_policy(name))

    def tenant_rate_terms(self, name: str) -> tuple[float, float, bool] | None:
        """With two-level keys, the rate terms (as ``rate_terms``) of key ``name``'s tenant;
        ``None`` with flat keys or a tenant without a rate."""
        separator = self.separator
        if separator is None:
            return None
        assert self.tenants is not None
        tenant = tenant_name(name, separator)
        return _rate_of(self.tenants.keys.get(tenant), lambda: self.tenant_policy(tenant))

    def limits(self) -> dict[str, int]:
        """The cap of every known key that has one. O(keys)."""
        return {n: key.limit for n, key in self.accounts.keys.items() if key.limit != UNLIMITED}

    def counted(self) -> set[str]:
        """The known keys with a cap or a minimum of slots. O(keys)."""
        return {
            n for n, key in self.accounts.keys.items() if key.limit != UNLIMITED or key.min_slots
        }

    def set_elsewhere(
        self, counts: Mapping[str, int], tenants: Mapping[str, int] | None = None
    ) -> None:
        """What other workers run of each key (keys not named: none), and with two-level
        keys of each tenant (``tenants``: as a store counts them; ``None``: the sums of its
        keys' ``counts``). O(keys and tenants named now or before), plus what each key or
        tenant whose cap moves unblocks."""
        before = self.elsewhere
        self.elsewhere = now = {k: n for k, n in counts.items() if n}
        known = self.accounts.keys
        for name in before.keys() | now.keys():
            key = known.get(name)
            if key is not None:
                key.elsewhere = now.get(name, 0)
                limits_changed(key)
        separator = self.separator
        if separator is None:
            return
        assert self.tenants is not None
        sums: dict[str, int] = {}
        if tenants is not None:
            sums = {t: n for t, n in tenants.items() if n}
        else:
            for name, n in now.items():
                tenant = tenant_name(name, separator)
                sums[tenant] = sums.get(tenant, 0) + n
        was = self.tenant_elsewhere
        self.tenant_elsewhere = sums
        for name in was.keys() | sums.keys():
            tenant_state = self.tenants.keys.get(name)
            if tenant_state is not None and tenant_state.elsewhere != sums.get(name, 0):
                tenant_state.elsewhere = sums.get(name, 0)
                limits_changed(tenant_state)

    # -- rate limits (core/rates.py) ---------------------------------------------------------

    def _rate_terms(self, key: KeyState, rate: float | None, burst: float, per_cost: bool) -> None:
        """Give ``key`` its rate terms at ``agenda.now``: a key newly limited starts with a full
        bucket, one whose burst shrank keeps no more than it. Its cap follows at once
        (``limits_changed``, by the caller)."""
        now = self.agenda.now
        if rate is None:
            key.rate = None
            key.limited = False
            return
        if key.rate is None:
            key.tokens, key.tokens_at = burst, now
        else:
            key.tokens = level_at(key.tokens, key.tokens_at, now, key.rate, key.burst)
            key.tokens_at = now
            if key.tokens > burst:
                key.tokens = burst
        key.rate, key.burst, key.per_cost = rate, burst, per_cost
        self._limit(key, now)

    def _limit(self, holder: Bucketed, now: float) -> bool:
        """Set ``holder.limited`` (a key's or a type's lane's) from its bucket's level at
        ``now`` (recorded at ``now``), and book its wake if it is out. Whether it changed; the
        caller makes its cap follow."""
        rate = holder.rate
        assert rate is not None
        level = holder.tokens = level_at(holder.tokens, holder.tokens_at, now, rate, holder.burst)
        holder.tokens_at = now
        limited = not may_start(level)
        if limited:
            heappush(self.wakes, (refill_at(level, now, rate), next(_ids), holder))
        was = holder.limited
        holder.limited = limited
        return was != limited

    def _rate_moved(self, holder: Bucketed) -> None:
        """``holder`` ran out of its rate, or refilled: its cap follows. A key refilled at its
        cap has its urgent heads (which pass a cap, never a rate limit) get their entries
        back. A type's lane is skipped (or not) by the next decision, as a paused one. O(1) for
        a type; O(q log n) for a key."""
        if not isinstance(holder, KeyState):
            holder.recap()
            return
        limits_changed(holder)
        if not holder.limited and holder.blocked is not None and self.agenda.active:
            resume(holder)

    def charge_rate(self, holder: Bucketed, estimate: float) -> None:
        """``holder`` (a rate-limited key, or type's lane) just started a job of ``estimate``:
        its bucket pays for it, and if that used it up it starts nothing more until it
        refills. O(log limited keys and types)."""
        self._move_tokens(holder, -start_charge(holder.per_cost, estimate))

    def refund_rate(self, holder: Bucketed, estimate: float) -> None:
        """What a start of ``estimate`` charged ``holder``'s bucket goes back (the start was
        undone, or the job never ran). O(1), plus what it unblocks."""
        if holder.rate is not None:
            self._move_tokens(holder, start_charge(holder.per_cost, estimate))

    def _move_tokens(self, holder: Bucketed, by: float) -> None:
        """``holder``'s bucket, refilled to ``agenda.now``, moves ``by``; its cap follows."""
        now = self.agenda.now
        rate = holder.rate
        assert rate is not None
        holder.tokens = level_at(holder.tokens, holder.tokens_at, now, rate, holder.burst) + by
        holder.tokens_at = now
        if self._limit(holder, now):
            self._rate_moved(holder)

    def set_tokens(self, holder: Bucketed, level: float) -> None:
        """Make ``holder``'s bucket ``level`` now (the fleet's, from a shared store). O(1),
        plus what it blocks or unblocks."""
        if holder.rate is None:
            return
        holder.tokens = min(level, holder.burst)
        holder.tokens_at = self.agenda.now
        if self._limit(holder, self.agenda.now):
            self._rate_moved(holder)

    def wake(self, now: float) -> None:
        """Let the keys and types whose buckets refilled by ``now`` run again. O(1) while
        none is due."""
        wakes = self.wakes
        while wakes and wakes[0][0] <= now:
            _, _, holder = heappop(wakes)
            if holder.limited and holder.rate is not None and self._limit(holder, now):
                self._rate_moved(holder)

    def next_wake(self) -> float:
        """When a key or type out of its rate may run again (``inf``: none is). O(1)
        amortised."""
        wakes = self.wakes
        while wakes and not wakes[0][2].limited:
            heappop(wakes)
        return wakes[0][0] if wakes else _INF

    # -- allocation ----------------------------------------------------------------------

    def demands(self) -> dict[str, KeyDemand]:
        """What ``allocation.shares`` needs of each key with work. O(keys)."""
        return {
            name: KeyDemand(
                key.weight,
                key.min_slots,
                None if key.limit == UNLIMITED else key.limit,
                0 if key.paused else key.running + key.pending,
            )
            for name, key in self.accounts.keys.items()
            if key.running + key.pending
        }

    def split(self) -> tuple[dict[str, KeyDemand], dict[str, dict[str, KeyDemand]]]:
        """With two-level keys, what ``allocation.two_levels`` takes: each tenant with work
        (its demand: what its keys can use together, none while it is paused) and, by tenant,
        its keys with work. O(keys)."""
        assert self.tenants is not None
        by_tenant: dict[str, dict[str, KeyDemand]] = {}
        sums: dict[str, int] = {}
        known = self.accounts.keys
        for name, demand in self.demands().items():
            tenant = known[name].tenant
            assert tenant is not None
            by_tenant.setdefault(tenant.name, {})[name] = demand
            sums[tenant.name] = sums.get(tenant.name, 0) + usable(demand)
        tenants = {}
        for name, n in sums.items():
            t = self.tenants.keys[name]
            cap = None if t.limit == UNLIMITED else t.limit
            tenants[name] = KeyDemand(t.weight, t.min_slots, cap, 0 if t.paused else n)
        return tenants, by_tenant

    def allocation(self, capacity: int) -> Allocation:
        """How many of ``capacity`` slots each key with work would get (with two-level keys,
        within its tenant's: ``allocation.two_levels``). O(k log k)."""
        if self.separator is None:
            return shares(capacity, self.demands())[1]
        return two_levels(capacity, *self.split()).keys

    def redistributed(self, capacity: int, slots: Mapping[str, int]) -> float:
        """The slots the allocation ``slots`` of ``capacity`` gives keys beyond their weighted
        share (``allocation.redistributed``); with two-level keys, what tenants got beyond
        theirs plus what keys got beyond theirs of their tenant's slots. O(k)."""
        if self.separator is None:
            return redistributed(capacity, self.demands(), slots)
        tenants, by_tenant = self.split()
        split = two_levels(capacity, tenants, by_tenant)
        out = redistributed(capacity, tenants, split.tenants.slots)
        for tenant, own in by_tenant.items():
            out += redistributed(split.tenants.slots.get(tenant, 0), own, slots)
        return out

    def demand_moved(self, key: KeyState, by: int) -> None:
        """``key``'s running plus pending jobs just moved ``by`` (+1 or -1): the allocation
        must be computed again if its room (``KeyState.room``) changed and, before or after,
        reached down to its share; above its share, a key's room moves nobody's
        (``allocation.shares``). With two-level keys, likewise for its tenant's room (what
        its keys can use together, ``KeyState.usable``) against the tenant's share. O(1)."""
        after = key.room()
        before = key.room(by)
        if after == before:
            return
        if min(before, after) <= key.share_frac + 1e-6:
            self.reshare_due = True
        tenant = key.tenant
        if tenant is not None:
            was = tenant_room(tenant)
            tenant.usable += after - before
            now = tenant_room(tenant)
            if was != now and min(was, now) <= tenant.share_frac + 1e-6:
                self.reshare_due = True

    def reshare(self, capacity: int) -> None:
        """Make each key's share its allocation of ``capacity`` again (with two-level keys,
        each tenant's first: ``_reshare_tenants``), and its rank follow. O(k log k) for the k
        keys with work, plus O(q log n) for each key or tenant that moves earlier."""
        self.reshare_due = False
        if self.separator is None:
            fracs, allocation = shares(capacity, self.demands())
        else:
            fracs, allocation = self._reshare_tenants(capacity)
        for name, key in self.accounts.keys.items():
            if name in fracs:
                key.share_frac = fracs[name]
                key.share = allocation.slots[name]
            else:  # no work: a job that comes makes this run again before it is decided
                key.share_frac = 0.0
                key.share = 0
            rerank(key)

    def _reshare_tenants(self, capacity: int) -> tuple[dict[str, float], Allocation]:
        """With two-level keys, make each tenant's share its allocation of ``capacity``
        (``allocation.two_levels``) and its rank follow; the keys' shares of their tenants'
        slots, for ``reshare``."""
        assert self.tenants is not None
        tenants, by_tenant = self.split()
        split = two_levels(capacity, tenants, by_tenant)
        for name, tenant in self.tenants.keys.items():
            own = by_tenant.get(name)
            if own is not None:
                tenant.share_frac = split.tenant_fracs[name]
                tenant.share = split.tenants.slots[name]
                tenant.usable = sum(usable(demand) for demand in own.values())
            else:
                tenant.share_frac = 0.0
                tenant.share = tenant.usable = 0
            rerank(tenant)
        return split.key_fracs, split.keys

    # -- pauses --------------------------------------------------------------------------

    def pause_key(self, name: str, paused: bool) -> None:
        """Pause (or resume) key ``name`` at ``agenda.now``, known or not yet. O(1) to pause;
        O(q log n) to resume."""
        if (name in self.paused_keys) == paused:
            return
        (self.paused_keys.add if paused else self.paused_keys.discard)(name)
        log = self.pauses.get(name)
        if log is None:
            log = self.pauses[name] = PauseLog()
        (log.pause if paused else log.resume)(self.agenda.now)
        key = self.accounts.keys.get(name)
        if key is not None:
            key.paused = paused
            key.pauses = log
            limits_changed(key)
            self.reshare_due = self.sharing
            if not paused and self.agenda.active:
                resume_aging(key)  # their waiting goes on: book their next rise again

    def pause_tenant(self, name: str, paused: bool) -> None:
        """Pause (or resume) tenant ``name`` (two-level keys) at ``agenda.now``, known or not
        yet: none of its keys' jobs start, and none of them ages, while it is paused. O(1)
        to pause; O(q log n) for its keys' queues to resume."""
        if (name in self.paused_tenants) == paused:
            return
        (self.paused_tenants.add if paused else self.paused_tenants.discard)(name)
        log = self.pauses.get(("tenant", name))
        if log is None:
            log = self.pauses["tenant", name] = PauseLog()
        (log.pause if paused else log.resume)(self.agenda.now)
        tenant = None if self.tenants is None else self.tenants.keys.get(name)
        if tenant is None:
            return
        tenant.paused = paused
        tenant.pauses = log
        limits_changed(tenant)
        self.reshare_due = self.sharing
        if not paused and self.agenda.active:
            resume(tenant)  # urgent heads pass its cap again
            for key in {kq.key for tq in tenant.queues or () for kq in tq.queues.values()}:
                resume_aging(key)  # its keys' waiting goes on: book their next rise again

    def pause_type(
        self,
        lane: Lane,
        paused: bool,
        lanes: Iterable[Lane],
        conflicts: Mapping[ConflictKey, Conflict],
    ) -> None:
        """Pause (or resume) ``lane``'s type at ``agenda.now`` (``lanes``: every lane, the
        type's side lanes among them). O(1); resuming an aging type, O(its queues)."""
        name = lane.type.name
        (self.paused_types.add if paused else self.paused_types.discard)(name)
        if lane.paused != paused:
            pause_lane(lane, paused, self.agenda.now, lanes, conflicts)


def pause_lane(
    lane: Lane,
    paused: bool,
    now: float,
    lanes: Iterable[Lane],
    conflicts: Mapping[ConflictKey, Conflict],
) -> None:
    """Pause or resume ``lane`` at ``now``; on resuming, the aging lanes of its type (among
    ``lanes``) have every key queue placed and booked again, parked ones too."""
    lane.paused = paused
    if lane.pauses is None:
        lane.pauses = PauseLog()
    (lane.pauses.pause if paused else lane.pauses.resume)(now)
    lane.recap()
    if paused:
        return
    for each in lanes:
        if each.type is lane.type and each.aging is not None:
            # Their waiting goes on: every key queue of the lane gets its place and booking.
            each.queue.refresh()
            for conflict in list(conflicts.values()):
                cl = conflict.lanes.get(each)
                if cl is not None:
                    cl.renew()


def rerank(key: KeyState) -> None:
    """Make ``key.rank`` follow its running jobs (here and elsewhere) against its minimum
    and its share. O(1) while it stays; O(q log n) when it changes."""
    rank = key.rank_now()
    old = key.rank
    if rank == old:
        return
    key.rank = rank
    if rank < old:  # earlier in the order: fresh entries (later: caught up lazily)
        reposition(key)


def _rate_of(
    known: KeyState | None, policy: Callable[[], KeyPolicy]
) -> tuple[float, float, bool] | None:
    """The rate terms of a key or tenant: ``known``'s if it is known, else its ``policy``'s."""
    if known is not None:
        return None if known.rate is None else (known.rate, known.burst, known.per_cost)
    terms = policy()
    return None if terms.rate is None else (terms.rate, terms.bucket, terms.per == "cost")


def tenant_room(tenant: KeyState) -> int:
    """How many slots the allocation lets ``tenant`` use: what its keys can use together
    (``usable``), no more than its cap, none while it is paused."""
    if tenant.paused:
        return 0
    return tenant.usable if tenant.usable < tenant.limit else tenant.limit


def limits_changed(key: KeyState) -> None:
    """``key``'s cap inputs changed: unblock it if it is below its cap (a key at its cap is
    blocked lazily, when a decision meets it). O(q log n)."""
    rerank(key)
    key.recap()
    if key.running < key.cap and key.blocked is not None:
        unblock(key)
