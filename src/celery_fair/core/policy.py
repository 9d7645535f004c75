"""The dispatch rule: which pending job is admissible, and which comes first.

Every rule that decides admission lives here. ``select`` is the hot path; ``blocked_by``
states the same rules one job at a time for snapshots, status and tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .fairqueue import _comes_before, conflict_held, key_blocks
from .types import BlockReason

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .fairqueue import Conflict, ConflictKey, PendingJob, Tier

__all__ = ["blocked_by", "comes_before", "select"]

comes_before = _comes_before
"""``comes_before(a, b)``: within a tier, ``a`` precedes ``b`` by (cost, arrival, seq)."""


def select(tiers: list[Tier], free_slots: int, aging: bool = False) -> PendingJob | None:
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
    tier with room is looked at and the lanes' best jobs compared by their places.

    Cost: O(tiers + lanes of the chosen tier) plus amortised O(log n) heap work; with
    ``aging``, O(lanes) plus the same heap work.
    """
    if free_slots <= 0:
        return None
    if aging:
        return _select_aged(tiers)
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


def _select_aged(tiers: list[Tier]) -> PendingJob | None:
    best: PendingJob | None = None
    best_place: tuple[float, int, float, float, int] | None = None
    for tier in tiers:
        if tier.pending == 0 or tier.running >= tier.cap:
            continue
        for lane in tier.lanes:
            queue = lane.queue
            if queue.size == 0 or lane.running >= lane.cap:
                continue
            job = queue.best(True)
            if job is not None:
                level, rank, acc = lane.place(job)
                place = (level, rank, acc, job.arrival, job.seq)
                if best_place is None or place < best_place:
                    best = job
                    best_place = place
    return best


def blocked_by(
    job: PendingJob, free_slots: int, conflicts: Mapping[ConflictKey, Conflict]
) -> tuple[BlockReason, ...]:
    """Every reason that keeps pending ``job`` from being admitted now (empty if none). O(1)."""
    reasons = []
    if free_slots <= 0:
        reasons.append(BlockReason.CAPACITY)
    lane = job.lane
    key = job.key
    if lane.tier.running >= lane.tier.cap:
        reasons.append(BlockReason.TIER_CAP)
    if lane.paused or key.paused:
        reasons.append(BlockReason.PAUSED)
    if not lane.paused and lane.running >= lane.cap:
        reasons.append(BlockReason.TYPE_CAP)
    if not key.paused and key_blocks(job):
        reasons.append(BlockReason.KEY_CAP)
    if conflict_held(conflicts, job):
        reasons.append(BlockReason.CONFLICT)
    return tuple(reasons)
