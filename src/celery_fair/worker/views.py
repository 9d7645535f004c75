"""What a gate shows: one job's status for job control, the flat statistics ``inspect stats``
and Flower read, and the figures a metrics scrape reads.

Each view reads the gate's parts (``Parts``) and changes nothing; the gate calls them under
its lock. O(held) at most (a held job's place, the tiers), never on a hot path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import words
from ..core import BlockReason, JobType, Scheduler
from ..core.inspect import why_to_dict
from ..engine import Engine
from ..metrics import GateLook, top_allocations, top_tenants
from ..observe import Counters
from ..protocol import JOB_STATES
from ..store.base import conflict_field
from .held import HeldJobs
from .lanes_here import LanesHere
from .reserve import Reserve
from .runs import Runs
from .window import Windows, blocked_idle

__all__ = ["Parts", "idle_blocked", "job_status", "jobs", "look", "pool_info"]


@dataclass(frozen=True, slots=True)
class Parts:
    """The parts of one gate that its views read."""

    held: HeldJobs
    reserve: Reserve
    runs: Runs
    scheduler: Scheduler
    engine: Engine
    counters: Counters
    windows: Windows
    types: Mapping[str, JobType]
    groups: Mapping[str, str]  # job type -> its conflict group
    metrics_top_keys: int
    lanes: LanesHere | None = None

    def type_priority(self, name: str) -> int:
        return self.types[name].priority


def jobs(
    parts: Parts,
    now: float,
    *,
    key: str | None = None,
    state: str | None = None,
    type: str | None = None,
    limit: int = 100,
) -> tuple[list[dict[str, Any]], int]:
    """The fair jobs this worker runs, has reserved or holds, filtered by fairness ``key``,
    ``state`` (``JOB_STATES``) and job ``type`` (``None``: any): the first ``limit`` in the
    order running, reserved, held, each oldest first, and how many matched in all. ``now``:
    monotonic. O(held + running), once per call of job control, never on a hot path."""
    found: list[tuple[int, float, dict[str, Any]]] = []
    if state in (None, "running"):
        for run in parts.runs:
            view = parts.scheduler.status(run.uid) if run.uid is not None else None
            if view is None or not _matches(view.fairness_key, view.type, key, type):
                continue
            entry = {
                "task_id": getattr(run.req, "id", None),
                "state": "running",
                "fairness_key": view.fairness_key,
                "type": view.type,
                "job_id": view.job_id,
                "priority": view.priority,
                "running": round(run.elapsed(now), 3),
            }
            found.append((0, run.dispatched, entry))
    if state in (None, "reserved", "held"):
        for uid, held in parts.held.items():
            where = "reserved" if uid in parts.reserve else "held"
            headers = held.headers
            if state not in (None, where) or not _matches(
                headers.fairness_key, headers.job_type, key, type
            ):
                continue
            entry = {
                "task_id": getattr(held.req, "id", None),
                "state": where,
                "fairness_key": headers.fairness_key,
                "type": headers.job_type,
                "job_id": headers.job_id,
                "priority": _held_priority(parts, uid, headers.job_type, held.priority),
                "waited": round(now - held.received, 3),
            }
            found.append((JOB_STATES.index(where), held.received, entry))
    found.sort(key=lambda item: (item[0], item[1]))
    return [entry for _, _, entry in found[: max(0, limit)]], len(found)


def _held_priority(parts: Parts, uid: str, job_type: str, asked: int | None) -> int:
    """A held job's own priority as the core has it (its key's ``max_priority`` may have
    lowered what was asked), else as asked, else its type's. O(1)."""
    here = parts.scheduler.priority_of(uid)
    if here is not None:
        return here
    return parts.type_priority(job_type) if asked is None else asked


def _matches(fairness_key: str, job_type: str, key: str | None, type: str | None) -> bool:
    return (key is None or fairness_key == key) and (type is None or job_type == type)


def job_status(parts: Parts, uid: str, now: float, pool_slots: int) -> dict[str, Any] | None:
    """What this worker knows of fair job ``uid`` (a uid, or its task id): held (waiting,
    with its place and what holds it back, as values), reserved (admitted, waiting for a free
    process) or running; ``None`` if it is not here. ``now``: monotonic. O(held) for a held
    job (its place), O(1) otherwise."""
    uid = parts.held.uid_of(uid)
    scheduler = parts.scheduler
    if uid in parts.runs.fair:
        view = scheduler.status(uid)
        out: dict[str, Any] = {"state": "running"}
        if view is not None:
            out["effective_priority"] = view.effective_priority
        return out
    held = parts.held.get(uid)
    if held is None:
        return None
    waited = round(now - held.received, 3)
    if uid in parts.reserve:
        return {"state": "reserved", "waited": waited}
    view = scheduler.status(uid)
    if view is None:
        return {"state": "held", "waited": waited}
    start = scheduler.expected_start(uid, pool_slots)
    found = scheduler.why(uid)
    waits_for = None if start is None else start.waits_for
    return {
        "state": "held",
        "waited": waited,
        "place": view.place,
        "place_in_key": view.place_in_key,
        "held": len(parts.held),
        "fairness_key": view.fairness_key,
        "priority": view.priority,
        "effective_priority": view.effective_priority,
        "urgent": view.urgent,
        "blocked_by": [r.value for r in view.blocked_by],
        # what holds it back, as values ("blockers", "ahead": core.inspect.why_to_dict); job
        # control writes them in English (celery_fair.words)
        **({} if found is None else why_to_dict(found)),
        "expected_wait": None if start is None else start.seconds,
        # the share of that estimate built on default costs (nothing learned yet)
        "expected_wait_defaults": 0.0 if start is None else start.from_defaults,
        # what it waits for that the estimate does not measure (a BlockReason's value)
        "waits_for_reason": None if waits_for is None else waits_for.value,
        # the same in words, for job-control clients older than the values
        "why": words.lines(found),
        "waits_for": words.waits_for(waits_for, found),
        # the conflict it waits for, for job control to name its holder fleet-wide
        "conflict": conflict_field(
            parts.groups.get(held.headers.job_type) or "", held.headers.job_id
        )
        if BlockReason.CONFLICT in view.blocked_by
        else "",
    }


def pool_info(
    parts: Parts, now: float, pool_slots: int, metrics_port: int | None
) -> dict[str, Any]:
    """Flat statistics for ``inspect stats`` (Flower shows them on the pool tab). ``now``:
    monotonic. O(held)."""
    scheduler = parts.scheduler
    held, reserve, runs = parts.held, parts.reserve, parts.runs
    oldest = held.oldest()
    tiers: dict[int, list[int]] = {p: [n, 0] for p, n in held.by_tier(parts.type_priority).items()}
    for priority, running in scheduler.running_by_tier().items():
        tiers.setdefault(priority, [0, 0])[1] += running
    by_tier = sorted(tiers.items(), reverse=True)
    windows = parts.windows
    return {
        "fair-oldest-held-seconds": round(now - oldest.received, 3) if oldest is not None else 0.0,
        **{f"fair-blocked-{r.replace('_', '-')}": n for r, n in scheduler.blocked_counts().items()},
        "fair-held": len(held),
        "fair-policies-version": parts.engine.policy_version,
        **{f"fair-held-tier-{p}": n[0] for p, n in by_tier},
        **{f"fair-running-tier-{p}": n[1] for p, n in by_tier},
        "fair-held-peak": held.peak,
        "fair-held-limit": windows.limit(),
        "fair-window-raised": windows.prefetch.raised,
        **({"fair-shard-windows": windows.shards.prefetch.info()} if windows.shards else {}),
        **(lanes_info(parts.lanes) if parts.lanes is not None else {}),
        "fair-key-allocation": dict(
            top_allocations(scheduler.allocation().slots, parts.metrics_top_keys)
        ),
        **tenants_info(scheduler.tenant_use(), parts.metrics_top_keys),
        # The pool's slots and the reserve apart: fair-running of fair-slots (the pool's size
        # less its plain runs) run in the pool; fair-reserved of fair-lookahead wait admitted
        # for a free process (the scheduler counts both).
        "fair-reserved": len(reserve),
        "fair-lookahead": reserve.lookahead,
        "fair-running": scheduler.running - len(reserve),
        "fair-slots": parts.runs.fair_slots(pool_slots),
        "plain-running": runs.plain,
        "plain-started": runs.plain_started,
        "pool-in-line": runs.in_line,
        **parts.counters.stats(),
        **({"fair-metrics-port": metrics_port} if metrics_port else {}),
        **{f"fair-store-{name}": v for name, v in parts.engine.info().items()},
    }


def tenants_info(tenants: dict[str, tuple[int, int, float]], top: int) -> dict[str, Any]:
    """``fair-tenants`` with two-level keys (nothing with flat keys): the tenants with the
    most jobs here (``fair_metrics_top_keys`` of them, the rest as ``other``), each with its
    running and held jobs and its accumulated cost. O(tenants log tenants)."""
    if not tenants:
        return {}
    return {
        "fair-tenants": {
            name: {"running": r, "held": p, "cost": round(c, 6)}
            for name, (r, p, c) in top_tenants(tenants, top)
        }
    }


def lanes_info(lanes: LanesHere) -> dict[str, Any]:
    """``fair-lanes-held``: the messages held from each lane that has some, by lane number;
    ``fair-stragglers-held``: those held from a shard whose key has a lane now, by shard
    number; ``fair-lanes-asked``: the lanes this worker asked for (rule 3, lanes_here.py).
    O(lanes + shards)."""
    held = lanes.crowding.held[lanes.shards : lanes.shards + lanes.consumed]
    return {
        "fair-lanes-held": {str(j): n for j, n in enumerate(held) if n},
        "fair-stragglers-held": {str(i): n for i, n in lanes.crowding.stragglers().items()},
        "fair-lanes-asked": lanes.asked,
    }


def look(parts: Parts, wall_now: float, pool_slots: int) -> GateLook:
    """What a metrics scrape reads (metrics.py). O(held + types + k log k), k keys."""
    scheduler = parts.scheduler
    held, oldest = parts.held.by_type(parts.type_priority)
    allocation = scheduler.allocation().slots
    return GateLook(
        held=held,
        running={(t, p): n for t, p, _, n in scheduler.by_type() if n},
        blocked=scheduler.blocked_counts(),
        reserved=len(parts.reserve),
        plain_running=parts.runs.plain,
        slots=parts.runs.fair_slots(pool_slots),
        lookahead=parts.reserve.lookahead,
        mode=parts.engine.mode.value,
        heads={key: max(0.0, wall_now - t) for key, t in oldest.items()},
        allocation=allocation,
        running_by_key=scheduler.running_by_key(),
        redistributed=scheduler.redistributed(allocation),
        levels=scheduler.pending_levels(),
        tenants=scheduler.tenant_use(),
    )


def idle_blocked(parts: Parts, *, deciding: bool) -> bool:
    """A pool process idles that no held job can take (``window.blocked_idle``); ``deciding``:
    a decision is due or the store is deciding. O(1)."""
    scheduler = parts.scheduler
    return blocked_idle(
        starved=scheduler.starved,
        running=scheduler.running,
        capacity=scheduler.capacity,
        lookahead=parts.reserve.lookahead,
        deciding=deciding,
    )
