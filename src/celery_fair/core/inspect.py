"""Inspection: where a job is, what holds it back, when it should start, the whole state.

Pure functions of the scheduler's structures, called by the ``Scheduler`` façade; none of
them changes anything or decides anything. What holds a job back comes back as values (the
``Blocker`` types below, one per ``BlockReason``, each with its numbers), never as words:
``celery_fair.words`` writes them in English at the edge, for whoever shows them (job control,
the command line, ``fair.slot``'s timeout, logs). ``why_to_dict`` and ``why_from_dict`` carry
them as plain data (a worker's job-status reply), so the English is written where it is shown.
What is admissible is ``policy.blocked_by``'s to say; this module only gathers its answer with
the numbers behind it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING

from .allocation import KeyDemand, shares
from .jobs import ELSEWHERE, Job
from .policy import blocked_by
from .rates import refill_at
from .types import BLOCK_ORDER, BlockReason, ExpectedStart, JobState, JobView, Snapshot

if TYPE_CHECKING:
    from .costs import Accounts, Estimates
    from .jobs import Conflict, ConflictKey, Lane, Tier

__all__ = [
    "Blocker",
    "CapFull",
    "ConflictHeld",
    "Paused",
    "RateLimited",
    "SlotsBusy",
    "Why",
    "blocked_counts",
    "expected_start",
    "place_of",
    "snapshot",
    "view",
    "why",
    "why_from_dict",
    "why_to_dict",
]


@dataclass(frozen=True, slots=True)
class Paused:
    """``PAUSED``: the job's type is paused (``type``), else its fairness key (``key``), else
    with two-level keys its key's tenant (``tenant``)."""

    type: str | None = None
    key: str | None = None
    tenant: str | None = None

    @property
    def reason(self) -> BlockReason:
        return BlockReason.PAUSED


@dataclass(frozen=True, slots=True)
class RateLimited:
    """``RATE_LIMIT``: fairness key ``key`` (or with ``key`` ``None``, job type ``type``) used
    up its rate; its bucket lets it start again in ``refills_in`` seconds, unless the fleet
    charges it meanwhile. With ``tenant`` (two-level keys), ``key`` names the job's key's
    tenant, whose one bucket all its keys' starts pay."""

    key: str | None
    refills_in: float
    type: str | None = None
    tenant: bool = False

    @property
    def reason(self) -> BlockReason:
        return BlockReason.RATE_LIMIT


@dataclass(frozen=True, slots=True)
class ConflictHeld:
    """``CONFLICT``: a running job holds ``(group, job_id)``: ``holder`` (the core's uid) for
    ``held_for`` seconds, or, both ``None``, a job on another worker."""

    group: str
    job_id: str
    holder: Hashable | None = None
    held_for: float | None = None

    @property
    def reason(self) -> BlockReason:
        return BlockReason.CONFLICT


@dataclass(frozen=True, slots=True)
class CapFull:
    """``KEY_CAP``, ``TENANT_CAP``, ``TYPE_CAP`` or ``TIER_CAP``: ``name`` (the fairness key,
    its tenant with two-level keys, the type, the tier's priority) runs ``running`` jobs here
    (a tenant: over all its keys) and ``elsewhere`` on other workers, against its ``limit``."""

    reason: BlockReason
    name: str | int
    running: int
    elsewhere: int
    limit: int


@dataclass(frozen=True, slots=True)
class SlotsBusy:
    """``CAPACITY``: ``running`` jobs fill the ``capacity`` slots."""

    running: int
    capacity: int

    @property
    def reason(self) -> BlockReason:
        return BlockReason.CAPACITY


Blocker = Paused | RateLimited | ConflictHeld | CapFull | SlotsBusy
"""One thing that holds a pending job back now, with its numbers."""


@dataclass(frozen=True, slots=True)
class Why:
    """Why a pending job is not running yet (``Scheduler.why``).

    Attributes:
        blockers: What holds it back, in ``BLOCK_ORDER`` (the one that would still hold it if
            the others went first); empty when it is admissible.
        ahead: How many pending jobs come before it in the dispatch order.
    """

    blockers: tuple[Blocker, ...]
    ahead: int


#: The blocker type of each reason (``why_from_dict``).
_KINDS: dict[BlockReason, type[Blocker]] = {
    BlockReason.PAUSED: Paused,
    BlockReason.RATE_LIMIT: RateLimited,
    BlockReason.CONFLICT: ConflictHeld,
    BlockReason.KEY_CAP: CapFull,
    BlockReason.TENANT_CAP: CapFull,
    BlockReason.TYPE_CAP: CapFull,
    BlockReason.TIER_CAP: CapFull,
    BlockReason.CAPACITY: SlotsBusy,
}


def why_to_dict(why: Why) -> dict[str, object]:
    """``why`` as plain data (JSON), as a worker's job-status reply carries it:
    ``{"blockers": [...], "ahead": n}``, each blocker its fields by name and its reason's value,
    e.g. ``{"reason": "type_cap", "name": "repack", "running": 3, "elsewhere": 0, "limit": 3}``
    (a conflict's ``holder`` is the core's ref as it is: plain data as long as the refs are, as
    the worker's task ids are). ``why_from_dict`` reads it back. O(blockers)."""
    return {"blockers": [_blocker_to_dict(b) for b in why.blockers], "ahead": why.ahead}


def why_from_dict(data: Mapping[str, object]) -> Why:
    """The ``Why`` that ``why_to_dict`` wrote ``data`` from (other keys of ``data`` are left
    alone, and so are fields a blocker does not have). O(blockers).

    Raises:
        ValueError: ``data`` is not such a document: a reason this version does not know (a
            newer worker's), a field or ``ahead`` missing.
    """
    blockers, ahead = data.get("blockers"), data.get("ahead")
    if not isinstance(blockers, list) or not isinstance(ahead, int):
        raise ValueError(f"not a why: {data!r}")
    return Why(tuple(_blocker_from_dict(b) for b in blockers), ahead)


def _blocker_to_dict(blocker: Blocker) -> dict[str, object]:
    given = {f.name: getattr(blocker, f.name) for f in fields(blocker) if f.name != "reason"}
    return {"reason": blocker.reason.value, **given}


def _blocker_from_dict(data: object) -> Blocker:
    try:
        if not isinstance(data, Mapping):
            raise TypeError(type(data).__name__)
        reason = BlockReason(data["reason"])
        kind = _KINDS[reason]
        given = {
            f.name: data[f.name]
            for f in fields(kind)
            if f.name != "reason" and (f.name in data or f.default is MISSING)
        }
    except (TypeError, KeyError, ValueError) as exc:
        raise ValueError(f"not a blocker: {data!r}") from exc
    return CapFull(reason, **given) if kind is CapFull else kind(**given)


#: What holds a job back that ``expected_start`` does not wait out by itself (a key cap is
#: modelled: its key's share of the slots is at most its cap).
_UNTIMED = frozenset(
    {
        BlockReason.PAUSED,
        BlockReason.RATE_LIMIT,
        BlockReason.TYPE_CAP,
        BlockReason.TIER_CAP,
        BlockReason.KEY_CAP,
        BlockReason.TENANT_CAP,
    }
)


def view(
    job: Job,
    place: int | None,
    place_in_key: int | None,
    free: int,
    conflicts: Mapping[ConflictKey, Conflict],
    urgent_passes: bool,
) -> JobView:
    """``job`` as a snapshot shows it; ``free``: the free slots now. O(1)."""
    pending = job.state is JobState.PENDING
    effective, urgent = job.lane.effective(job) if pending else job.effective
    return JobView(
        uid=job.uid,
        type=job.lane.type.name,
        job_id=job.job_id,
        fairness_key=job.key.name,
        priority=job.lane.tier.priority,
        arrival=job.arrival,
        state=job.state,
        place=place,
        place_in_key=place_in_key,
        blocked_by=blocked_by(job, free, conflicts, urgent_passes) if pending else (),
        effective_priority=effective,
        urgent=urgent,
    )


def place_of(job: Job, jobs: Iterable[Job]) -> tuple[int, int]:
    """Pending ``job``'s 1-based place among the pending ``jobs``, and among its key's. O(n)."""
    mine = job.order()
    place = 1
    place_in_key = 1
    for other in jobs:
        if other.state is JobState.PENDING and other.order() < mine:
            place += 1
            if other.key is job.key:
                place_in_key += 1
    return place, place_in_key


def blocked_counts(
    jobs: Iterable[Job],
    free: int,
    conflicts: Mapping[ConflictKey, Conflict],
    urgent_passes: bool,
) -> dict[str, int]:
    """Pending jobs by the first reason of ``BLOCK_ORDER`` that holds each back, and
    ``"admissible"`` (``Scheduler.blocked_counts``). O(pending)."""
    counts = dict.fromkeys((*(r.value for r in BLOCK_ORDER), "admissible"), 0)
    for job in jobs:
        if job.state is not JobState.PENDING:
            continue
        reasons = blocked_by(job, free, conflicts, urgent_passes)
        name = "admissible"
        for reason in BLOCK_ORDER:
            if reason in reasons:
                name = reason.value
                break
        counts[name] += 1
    return counts


def why(
    job: Job,
    seen: JobView,
    conflicts: Mapping[ConflictKey, Conflict],
    now: float,
    running: int,
    capacity: int,
) -> Why:
    """What holds pending ``job`` back (``seen``: its view), each with its numbers. O(1)."""
    assert seen.place is not None
    lane = job.lane
    tier = lane.tier
    key = job.key
    found: list[Blocker] = []
    for reason in sorted(seen.blocked_by, key=BLOCK_ORDER.index):
        if reason is BlockReason.PAUSED:
            if lane.paused:
                found.append(Paused(type=lane.type.name))
            elif key.paused or key.tenant is None:
                found.append(Paused(key=key.name))
            else:
                found.append(Paused(tenant=key.tenant.name))
        elif reason is BlockReason.RATE_LIMIT:
            if lane.limited:
                assert lane.rate is not None
                due = refill_at(lane.tokens, lane.tokens_at, lane.rate)
                found.append(RateLimited(None, max(0.0, due - now), type=lane.type.name))
            for bucket in (key, key.tenant):
                if bucket is not None and bucket.limited:
                    assert bucket.rate is not None
                    due = refill_at(bucket.tokens, bucket.tokens_at, bucket.rate)
                    refills_in = max(0.0, due - now)
                    found.append(RateLimited(bucket.name, refills_in, tenant=bucket.is_tenant))
        elif reason is BlockReason.CONFLICT:
            ckey = job.ckey
            assert ckey is not None
            holder = conflicts[ckey].holder
            if holder is None or holder is ELSEWHERE:
                found.append(ConflictHeld(ckey[0], ckey[1]))
            else:
                found.append(ConflictHeld(ckey[0], ckey[1], holder.uid, now - holder.admitted_at))
        elif reason is BlockReason.KEY_CAP:
            found.append(CapFull(reason, key.name, key.running, key.elsewhere, key.limit))
        elif reason is BlockReason.TENANT_CAP:
            tenant = key.tenant
            assert tenant is not None
            found.append(
                CapFull(reason, tenant.name, tenant.running, tenant.elsewhere, tenant.limit)
            )
        elif reason is BlockReason.TYPE_CAP:
            found.append(CapFull(reason, lane.type.name, lane.running, lane.elsewhere, lane.limit))
        elif reason is BlockReason.TIER_CAP:
            found.append(CapFull(reason, tier.priority, tier.running, tier.elsewhere, tier.limit))
        elif reason is BlockReason.CAPACITY:
            found.append(SlotsBusy(running, capacity))
    return Why(tuple(found), seen.place - 1)


def expected_start(
    job: Job,
    seen: JobView,
    jobs: Iterable[Job],
    estimates: Estimates,
    slots: int,
    demands: Mapping[str, KeyDemand],
    now: float,
) -> ExpectedStart:
    """When pending ``job`` (``seen``: its view) is expected to start on ``slots`` slots
    (``Scheduler.expected_start`` says the model); ``demands``: each key with work. O(n)."""
    waits_for = next((r for r in BLOCK_ORDER if r in seen.blocked_by and r in _UNTIMED), None)
    if waits_for is not None and waits_for is not BlockReason.KEY_CAP:
        return ExpectedStart(None, waits_for)
    mine = job.order()
    guess = estimates.guess
    slots = max(1, slots)
    work = 0.0  # everything ahead of it here
    default = 0.0  # of which counted at a default_cost
    in_key = 0.0  # its own key's jobs ahead of it
    for other in jobs:
        jtype = other.lane.type
        if other.state is JobState.RUNNING:
            cost, is_default = other.estimate, False  # what it was charged
            if other.cost is None and (jtype.name, other.job_id) not in estimates:
                cost, is_default = guess((jtype.name, other.job_id), other.estimate)
            left = max(0.0, cost - (now - other.admitted_at))
            work += left
            default += left if is_default else 0.0
        elif other is not job and other.order() < mine:
            if other.cost is None:
                cost, is_default = guess((jtype.name, other.job_id), jtype.default_cost)
            else:
                cost, is_default = other.cost, False
            work += cost
            default += cost if is_default else 0.0
            if other.key is job.key:
                in_key += cost
    # and no faster than its key is served: its share of the slots (allocation.py)
    share = shares(slots, demands)[0].get(job.key.name, 0.0)
    by_key = in_key / share if share > 0 else 0.0
    return ExpectedStart(max(work / slots, by_key), waits_for, default / work if work > 0 else 0.0)


def snapshot(
    jobs: Iterable[Job],
    now: float,
    capacity: int,
    running: int,
    pending: int,
    tiers: Iterable[Tier],
    lanes: Mapping[str, Lane],
    accounts: Accounts,
    estimates: Estimates,
    conflicts: Mapping[ConflictKey, Conflict],
    urgent_passes: bool,
) -> Snapshot:
    """The whole state, pending jobs in dispatch order with their places. O(n log n)."""
    jobs = list(jobs)
    pending_jobs = sorted((j for j in jobs if j.state is JobState.PENDING), key=Job.order)
    running_jobs = sorted((j for j in jobs if j.state is JobState.RUNNING), key=lambda j: j.token)
    free = capacity - running
    per_key: dict[str, int] = {}
    views = []
    for place, job in enumerate(pending_jobs, start=1):
        n = per_key[job.key.name] = per_key.get(job.key.name, 0) + 1
        views.append(view(job, place, n, free, conflicts, urgent_passes))
    views.extend(view(job, None, None, free, conflicts, urgent_passes) for job in running_jobs)
    running_by_key: dict[str, int] = {}
    for job in running_jobs:
        running_by_key[job.key.name] = running_by_key.get(job.key.name, 0) + 1
    return Snapshot(
        now=now,
        capacity=capacity,
        running=running,
        pending=pending,
        running_by_tier={t.priority: t.running for t in tiers},
        running_by_type={name: lane.running for name, lane in lanes.items()},
        pending_by_key=per_key,
        running_by_key=running_by_key,
        accumulated_cost=accounts.costs(),
        estimates=dict(estimates.items()),
        jobs=tuple(views),
    )
