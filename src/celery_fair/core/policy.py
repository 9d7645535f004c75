"""The dispatch rule: which pending job is admissible, and which comes first.

Every rule that decides admission lives here, once: the structures of ``fairqueue.py`` import
``comes_before``, ``key_holds`` and ``key_blocks`` from this module to keep their order and
their wait lists, and import nothing of it else. ``select`` is the hot path; ``blocked_by``
states the same rules one job at a time for snapshots, status and tests; ``goes_before`` says
whether a pending job comes before admissions already made (``Scheduler.outranks``).

This module reads the records of ``jobs.py`` (tiers, lanes, jobs, conflicts) and ``costs.py``
(keys), which import neither it nor ``fairqueue.py``: the index depends on the rule, and the rule
only on the records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .aging import URGENT
from .types import BlockReason

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from .costs import KeyState
    from .jobs import Conflict, ConflictKey, Job, Order, Tier
    from .types import Admission

__all__ = [
    "blocked_by",
    "comes_before",
    "conflict_held",
    "goes_before",
    "key_blocks",
    "key_holds",
    "select",
]

_NEG_URGENT = -URGENT
"""The first component of an urgent job's place (``Lane.place``): urgent jobs go first."""


def comes_before(a: Job, b: Job) -> bool:
    """Whether pending ``a`` precedes pending ``b`` in their tier: by place (effective
    priority, rank, accumulated cost of the key, in the order of the priority scope; urgent
    jobs first), then arrival, then submission order. O(1)."""
    if a.lane.aging is not None or b.lane.aging is not None or a.lane.two_level:
        return a.lane.order(a) < b.lane.order(b)
    a_key = a.key
    b_key = b.key
    if a_key.rank != b_key.rank:
        return a_key.rank < b_key.rank
    a_acc = a_key.acc
    b_acc = b_key.acc
    if a_acc != b_acc:
        return a_acc < b_acc
    if a.arrival != b.arrival:
        return a.arrival < b.arrival
    return a.seq < b.seq


def key_holds(key: KeyState, level: float) -> bool:
    """Whether ``key`` holds back its job whose place starts with ``level`` (``-effective
    priority``): the key runs its cap (``cap`` counts its jobs elsewhere, its pause and its
    rate limit), and the job is not urgent, or the key is halted (an urgent job passes a key's
    cap, never its pause or its rate limit). O(1)."""
    return key.running >= key.cap and (level != _NEG_URGENT or key.halted)


def key_blocks(job: Job) -> bool:
    """Whether ``job``'s key, or with two-level keys its tenant, holds it back now
    (``key_holds`` at the job's place, for each). O(1)."""
    key = job.key
    tenant = key.tenant
    if key.running < key.cap and (tenant is None or tenant.running < tenant.cap):
        return False
    level = job.lane.place(job)[0]
    return key_holds(key, level) or (tenant is not None and key_holds(tenant, level))


def conflict_held(conflicts: Mapping[ConflictKey, Conflict], job: Job) -> bool:
    """Whether a running job (here or elsewhere) holds ``job``'s conflict. O(1)."""
    ckey = job.ckey
    if ckey is None:
        return False
    conflict = conflicts.get(ckey)
    return conflict is not None and conflict.holder is not None


def select(
    tiers: list[Tier], free_slots: int, aging: bool = False, urgent_passes: bool = True
) -> Job | None:
    """The first admissible pending job in the order
    ``(-effective priority, rank[key], acc[key], arrival, seq)`` (priority scope ``"global"``)
    or ``(rank[key], acc[key], -effective priority, arrival, seq)`` (``"key"``), urgent jobs
    first by age.

    A job is admissible when a global slot is free, its tier runs fewer jobs than the tier
    cap, its type runs fewer than ``max_concurrency`` and is not paused, its fairness key
    runs fewer than its ``max_concurrency`` and is neither paused nor out of its rate, and no
    running job holds its conflict. A full or paused tier or type is skipped as a whole; a key
    at its cap, paused or out of its rate has its key queues taken out of the heaps the first
    time one is met, and a job whose conflict is held is parked on the way; neither is looked
    at again until what blocks it frees. So a blocked job never blocks the jobs behind it, and
    the cost of a decision does not grow with blocked jobs.

    With ``aging`` (some lane ages, or the scope is ``"key"``), a lane's best job may come
    before a higher tier's, so every tier with room is looked at and the lanes' best jobs
    compared by their places (``Lane.place``, in the scope's order). An urgent
    job counts only this scheduler's own running jobs against its tier's and type's caps: what
    other workers run of them is the store's to weigh, which holds the next slot to free for it
    (docs/design.md 5e); so a tier or type full only by other workers' jobs is looked at too,
    for an urgent best job. Not with ``urgent_passes=False``: what runs elsewhere is then a
    share that binds every job.

    Cost: O(tiers + lanes of the chosen tier) plus amortised O(log n) heap work; with
    ``aging``, O(lanes) plus the same heap work.
    """
    if free_slots <= 0:
        return None
    if aging:
        return _select_aged(tiers, urgent_passes)
    for tier in tiers:
        if tier.pending == 0 or tier.running >= tier.cap:
            continue
        best: Job | None = None
        for lane in tier.lanes:
            queue = lane.queue
            if (queue.size == 0 and not queue.waiters) or lane.running >= lane.cap:
                continue
            job = queue.best(True)
            if job is not None and (best is None or comes_before(job, best)):
                best = job
        if best is not None:
            return best
    return None


def _select_aged(tiers: list[Tier], urgent_passes: bool) -> Job | None:
    best: Job | None = None
    best_place: Order | None = None
    for tier in tiers:
        if tier.pending == 0:
            continue
        tier_full = tier.running >= tier.cap
        if tier_full and (not urgent_passes or tier.running >= tier.limit):
            continue
        for lane in tier.lanes:
            queue = lane.queue
            if queue.size == 0 and not queue.waiters:
                continue
            full = tier_full or lane.running >= lane.cap
            if full and (not urgent_passes or lane.halted or lane.running >= lane.limit):
                continue
            job = queue.best(True)
            if job is not None:
                place = lane.order(job)
                if full and place[0] != _NEG_URGENT:
                    continue  # full but for other workers' jobs, which only urgent jobs pass
                if best_place is None or place < best_place:
                    best = job
                    best_place = place
    return best


def blocked_by(
    job: Job,
    free_slots: int,
    conflicts: Mapping[ConflictKey, Conflict],
    urgent_passes: bool = True,
) -> tuple[BlockReason, ...]:
    """Every reason that keeps pending ``job`` from being admitted now (empty if none). O(1)."""
    reasons = []
    if free_slots <= 0:
        reasons.append(BlockReason.CAPACITY)
    lane = job.lane
    key = job.key
    tier = lane.tier
    # An urgent job counts only the jobs running here against these caps (see select).
    urgent = urgent_passes and lane.aging is not None and lane.place(job)[0] == _NEG_URGENT
    if tier.running >= (tier.limit if urgent else tier.cap):
        reasons.append(BlockReason.TIER_CAP)
    tenant = key.tenant
    if lane.paused or key.paused or (tenant is not None and tenant.paused):
        reasons.append(BlockReason.PAUSED)
    if key.limited or lane.limited or (tenant is not None and tenant.limited):
        reasons.append(BlockReason.RATE_LIMIT)
    if not lane.halted and lane.running >= (lane.limit if urgent else lane.cap):
        reasons.append(BlockReason.TYPE_CAP)
    if key.running >= key.cap or (tenant is not None and tenant.running >= tenant.cap):
        level = lane.place(job)[0]  # (a halted key's or tenant's cap of 0 is not a cap)
        if not key.halted and key_holds(key, level):
            reasons.append(BlockReason.KEY_CAP)
        if tenant is not None and not tenant.halted and key_holds(tenant, level):
            reasons.append(BlockReason.TENANT_CAP)
    if conflict_held(conflicts, job):
        reasons.append(BlockReason.CONFLICT)
    return tuple(reasons)


def goes_before(
    job: Job,
    cost: float,
    admitted: Iterable[Admission],
    keys: Mapping[str, KeyState],
    tolerance: float,
) -> bool:
    """Whether pending ``job``, whose estimate is ``cost``, goes before admissions of
    ``admitted`` (admitted, not yet started) whose estimates add up to at least ``tolerance``
    (``Scheduler.outranks`` says when the question may be asked). O(1) per admission.

    ``job`` goes before an admission when it is urgent and the admission is not (or is, but
    arrived later), when it is of a higher effective priority, or of the same and its key,
    even charged ``cost``, has used no more than the admission's key had before it was
    charged (``keys``: the keys by name, as the admissions' keys are now). With priority
    scope ``"key"`` the cost comes first: it goes before when its key, charged ``cost``, has
    used less, or as much and its priority is no lower. With two-level keys, a job and an
    admission of different tenants compare their tenants' costs instead.
    """
    by_key = job.lane.by_key
    priority, urgent = job.lane.effective(job)
    mine = job.key
    tenant = mine.tenant
    ahead = 0.0  # the estimates of the admissions ``job`` goes before
    for other in admitted:
        if urgent or other.urgent:  # urgent jobs go first, oldest first
            if not urgent or (other.urgent and job.arrival >= other.arrival):
                continue
        else:
            theirs = other.effective_priority
            if theirs is None:
                theirs = other.priority
            # What ``job``'s key would have used, and what the admission's had: with
            # two-level keys, their tenants' when the tenants differ.
            key = keys.get(other.fairness_key)
            if tenant is not None and key is not None and key.tenant not in (None, tenant):
                used = tenant.acc + cost
                before = key.tenant.acc - other.estimate
            else:
                used = mine.acc + cost
                before = (0.0 if key is None else key.acc) - other.estimate
            if by_key:
                if used > before or (used == before and priority < theirs):
                    continue
            elif priority < theirs or (priority == theirs and used > before):
                continue
        ahead += other.estimate
        if ahead >= tolerance:
            return True
    return False
