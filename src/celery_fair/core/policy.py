"""The dispatch rule: which pending job is admissible, and which comes first.

Every rule that decides admission lives here. ``select`` is the hot path; ``blocked_by``
states the same rules one job at a time for snapshots, status and tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .fairqueue import _NEG_URGENT, _comes_before, conflict_held, key_blocks
from .types import BlockReason

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .fairqueue import Conflict, ConflictKey, PendingJob, Tier

__all__ = ["blocked_by", "comes_before", "select"]

comes_before = _comes_before
"""``comes_before(a, b)``: within a tier, ``a`` precedes ``b`` by (cost, arrival, seq)."""


def select(
    tiers: list[Tier], free_slots: int, aging: bool = False, urgent_passes: bool = True
) -> PendingJob | None:
    """The first admissible pending job in the order
    ``(-effective priority, rank[key], acc[key], arrival, seq)``, urgent jobs first by age.

    A job is admissible when a global slot is free, its tier runs fewer jobs than the tier
    cap, its type runs fewer than ``max_concurrency`` and is not paused, its fairness key
    runs fewer than its ``max_concurrency`` and is not paused, and no running job holds its
    conflict. A full or paused tier or type is skipped as a whole; a key at its cap or paused
    has its key queues taken out of the heaps the first time one is met, and a job whose
    conflict is held is parked on the way; neither is looked at again until what blocks it
    frees. So a blocked job never blocks the jobs behind it, and the cost of a decision does
    not grow with blocked jobs.

    With ``aging`` (some lane ages), a lane's best job may have risen above its tier, so every
    tier with room is looked at and the lanes' best jobs compared by their places. An urgent
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
        best: PendingJob | None = None
        for lane in tier.lanes:
            queue = lane.queue
            if queue.size == 0 or lane.running >= lane.cap:
                continue
            job = queue.best(True)
            if job is not None and (best is None or comes_before(job, best)):
                best = job
        if best is not None:
            return best
    return None


def _select_aged(tiers: list[Tier], urgent_passes: bool) -> PendingJob | None:
    best: PendingJob | None = None
    best_place: tuple[float, int, float, float, int] | None = None
    for tier in tiers:
        if tier.pending == 0:
            continue
        tier_full = tier.running >= tier.cap
        if tier_full and (not urgent_passes or tier.running >= tier.limit):
            continue
        for lane in tier.lanes:
            queue = lane.queue
            if queue.size == 0:
                continue
            full = tier_full or lane.running >= lane.cap
            if full and (not urgent_passes or lane.paused or lane.running >= lane.limit):
                continue
            job = queue.best(True)
            if job is not None:
                level, rank, acc = lane.place(job)
                if full and level != _NEG_URGENT:
                    continue  # full but for other workers' jobs, which only urgent jobs pass
                place = (level, rank, acc, job.arrival, job.seq)
                if best_place is None or place < best_place:
                    best = job
                    best_place = place
    return best


def blocked_by(
    job: PendingJob,
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
    if lane.paused or key.paused:
        reasons.append(BlockReason.PAUSED)
    if not lane.paused and lane.running >= (lane.limit if urgent else lane.cap):
        reasons.append(BlockReason.TYPE_CAP)
    if not key.paused and key_blocks(job):
        reasons.append(BlockReason.KEY_CAP)
    if conflict_held(conflicts, job):
        reasons.append(BlockReason.CONFLICT)
    return tuple(reasons)
