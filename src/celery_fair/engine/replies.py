"""How a store's reply becomes the engine's and the core's: the apply half of each call.

``apply_admit`` turns the reply to an admit call into a ``Decision``: each grant admitted starts
(unless the job was cancelled meanwhile, or the reply came too late to trust), each refusal is
undone in the core and, by its verdict, waits for a conflict held elsewhere, a poll, the next
runtime policies, or the end of the copy running elsewhere, or is dropped for good (``DONE``);
the fleet's costs, rate buckets, estimates and counts in the reply reach the core.
``apply_beat`` and ``apply_register`` do the same for a beat's view and a registration's
result. The calls
(``calls.py``) reach these through ``Engine._apply_admit`` and its siblings.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import TYPE_CHECKING

from ..core import Admission
from ..store.base import REFUSAL_REASONS, Verdict, conflict_field
from .calls import Decision
from .modes import Event
from .reserved import gave_back_stale

if TYPE_CHECKING:
    from ..store.base import Registered, Reply, View
    from .calls import AdmitCall, BeatCall, RegisterCall
    from .engine import Engine

__all__ = ["apply_admit", "apply_beat", "apply_register"]

logger = logging.getLogger("celery_fair.engine.engine")  # the engine's: its records keep their name

#: The caps that workers share, which an urgent job refused for claims (``Ask.claim``).
_SHARED_CAPS = (Verdict.TIER_CAP, Verdict.TYPE_CAP)


def apply_admit(engine: Engine, call: AdmitCall, reply: Reply) -> Decision:
    core = engine.core
    jobs = engine._jobs
    engine._see_epoch(reply.epoch)
    for done, job, fin in zip(call.done, call.finished, reply.finished, strict=True):
        engine._count_mine(job, -1)
        if fin.applied and done.elapsed is not None and fin.estimate is not None:
            core.set_estimate(job.ask.type, job.job_id, fin.estimate)  # the fleet's
    start: list[Admission] = []
    drop: list[Hashable] = []
    costs: dict[str, float] = {}
    tenant_costs: dict[str, float] = {}  # two-level keys: each tenant's, fleet-wide
    now = engine.clock.now()
    # A reply read a lease or more after its call was sent (this worker was paused in
    # between): the store may have released what it admitted since, so none of it starts.
    late = now - call.sent >= engine._held_for
    given: list[Hashable] = []
    tokens: dict[str, float] = {}  # each rate-limited key's bucket, fleet-wide, after the call
    type_tokens: dict[str, float] = {}  # and each rate-limited type's
    tenant_tokens: dict[str, float] = {}  # and each rate-limited tenant's (two-level keys)
    for admission, grant in zip(call.admissions, reply.grants, strict=True):
        uid = admission.uid
        job = jobs[uid]
        costs[job.ask.fairness_key] = grant.accumulated
        if grant.tenant_accumulated is not None and job.ask.tenant is not None:
            tenant_costs[job.ask.tenant] = grant.tenant_accumulated
        if grant.tokens is not None:
            tokens[job.ask.fairness_key] = grant.tokens
        if grant.type_tokens is not None:
            type_tokens[job.ask.type] = grant.type_tokens
        if grant.tenant_tokens is not None and job.ask.tenant is not None:
            tenant_tokens[job.ask.tenant] = grant.tenant_tokens
        verdict = grant.verdict
        if verdict is Verdict.ADMITTED:
            job.token = grant.token
            job.estimate = grant.estimate if grant.estimate is not None else 0.0
            engine._count_mine(job, 1)
            engine._max_token = max(engine._max_token, grant.token)
            job.term = engine._term
            if job.cancelled:
                engine.finish(uid, None)
                continue
            if late:
                engine._give_back(uid, job)
                given.append(uid)
                continue
            # Built whole: NamedTuple._replace costs several times as much.
            a = admission
            start.append(
                Admission(
                    a.uid, a.type, a.job_id, a.fairness_key, a.priority,
                    job.estimate, grant.token, a.arrival, a.admitted_at,
                    a.effective_priority, a.urgent,
                )
            )  # fmt: skip
            continue
        if verdict in REFUSAL_REASONS:
            reason = REFUSAL_REASONS[verdict]
            engine.observer.blocked(job.ask.type, job.ask.priority, reason)
        if verdict is Verdict.CONFLICT and job.job_id is not None:
            core.hold_elsewhere(job.group, job.job_id)  # first: the revert parks it there
        core.revert(uid)
        if verdict is Verdict.RECOVERING:
            engine._pause_until = now + engine.poll_interval
        elif verdict is Verdict.PAUSED:
            engine._policy_version = -1  # read them whole again
            engine.state.on(Event.PAUSED)
        elif (admission.urgent or engine.foreground) and verdict in _SHARED_CAPS:
            # The store holds the cap's next free slot for it: ask again at the next
            # poll, and meanwhile leave the core to jobs that other caps let run.
            core.cancel(uid)
            engine._stalled[uid] = now + engine.poll_interval
        elif verdict is Verdict.RUNNING:
            core.cancel(uid)
            engine._stalled[uid] = now + engine.poll_interval
            if not job.stalled:
                job.stalled = True
                engine.observer.stalled()
                logger.info(
                    "celery-fair: job %s runs on another worker; holding this copy until "
                    "it ends or its worker's lease expires.",
                    uid,
                )
        elif verdict is Verdict.DONE:
            core.cancel(uid)
            del jobs[uid]
            drop.append(uid)
            engine.observer.dropped()
        if job.cancelled and uid in jobs:
            core.cancel(uid)
            engine._stalled.pop(uid, None)
            del jobs[uid]
    if given:
        gave_back_stale(engine, given)
    for key, value in costs.items():
        core.set_accumulated(key, value)
    for tenant, value in tenant_costs.items():
        core.set_tenant_accumulated(tenant, value)
    for key, level in tokens.items():  # a key out of its rate waits here until it refills
        core.set_tokens(key, level)
    for name, level in type_tokens.items():  # and so does a type
        core.set_type_tokens(name, level)
    for tenant, level in tenant_tokens.items():  # and a tenant
        core.set_tenant_tokens(tenant, level)
    fleet = engine._fleet
    fleet.fleet_keys.update(reply.keys)
    fleet.fleet_tenants.update(reply.tenants)
    fleet.see(core, reply.tiers, reply.types, reply.workers, foreground=engine.foreground)
    held = [reply.held[conflict_field(*c)] for c in call.watch]
    fleet.see_conflicts(core, call.watch, held)
    return Decision(start, drop, None)


def apply_beat(engine: Engine, call: BeatCall, view: View) -> None:
    engine._beat_due = engine.clock.now() + engine.beat_interval
    engine._see_epoch(view.epoch)
    if view.policies != engine._policy_version:
        engine._see_policies(view.policies, view.policy_doc or "")
    for key, value in view.accumulated.items():
        engine.core.set_accumulated(key, value)
    for tenant, value in view.tenant_accumulated.items():
        engine.core.set_tenant_accumulated(tenant, value)
    # The beat asked about every key (and tenant) with jobs pending here: the others matter
    # to no decision here until they have some, and an admission's reply reports them again.
    counted = engine.core.counted_keys()
    fleet = engine._fleet
    fleet.fleet_keys = {k: view.keys.get(k, 0) for k in call.keys if k in counted}
    counted = engine.core.counted_tenants()
    fleet.fleet_tenants = {t: view.tenants.get(t, 0) for t in call.tenants if t in counted}
    fleet.see(engine.core, view.tiers, view.types, view.workers, foreground=engine.foreground)
    held = [view.held[conflict_field(*c)] for c in call.watch]
    fleet.see_conflicts(engine.core, call.watch, held)
    expected = fleet.mine()
    if view.mine < expected:
        # The store lost some of our jobs (our lease expired during a pause, or it came
        # back empty): they do run, so they must count again.
        if engine.state.on(Event.LOST):
            engine.observer.lease_lost()
    elif view.mine > expected:
        # The store counts jobs of ours that ended (their release was lost: a failover to
        # a replica that had not seen it). Only a full list tells it which.
        engine.state.on(Event.EXTRA)


def apply_register(engine: Engine, call: RegisterCall, result: Registered) -> None:
    if result.registered:
        engine.observer.registered(result.registered)
    if result.released:
        engine.observer.reconciled(result.released)
    engine.state.on(Event.REGISTERED)
    for job in call.flipped:  # admitted locally, in the store from now on
        job.term = engine._term
    if result.registered:
        logger.info(
            "celery-fair: registered %d running job(s) the store did not know.",
            result.registered,
        )
    if result.released:
        logger.warning(
            "celery-fair: released %d job(s) the store counted as running on this "
            "worker, which does not run them (a release lost in a failover?).",
            result.released,
        )
