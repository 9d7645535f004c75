"""Admitted jobs that have not started: may they start now, or should they give way?

A worker reserves the jobs the store admitted until its pool can take them; meanwhile two things
may make one of them wrong to start. Its lease may have lapsed since the store admitted it (this
worker was paused, or could not reach the store, for a lease or more): the store may have
released it and admitted a conflicting job elsewhere, so ``vet`` gives it back to be admitted
again. And newcomers may now rank before it: ``reconsider`` asks the core whether it would pick
the same jobs first now, and gives back those it would not. A job given back is pending again
at its old place, and the next store call reports it unstarted (its charge refunded).
``Engine.vet`` and ``Engine.reconsider`` are these functions.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from typing import TYPE_CHECKING, NamedTuple

from .modes import Mode

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["Vetted", "gave_back_stale", "reconsider", "vet"]

logger = logging.getLogger("celery_fair.engine.engine")  # the engine's: its records keep their name

#: Modes in which admitted jobs that have not started may be given back (``reconsider``).
_RECONSIDER = (Mode.ALONE, Mode.SHARED)


class Vetted(NamedTuple):
    """Which reserved jobs may start now (``Engine.vet``)."""

    ready: list[Hashable]  # may start now, in the order given
    given_back: list[Hashable]  # pending again: no longer reserved


def reconsider(engine: Engine, reserved: list[Hashable]) -> list[Hashable]:
    """Admitted jobs that have not started (``reserved``): would the core admit the same
    jobs first now, after what arrived since? The longest run of its picks that are all
    reserved jobs stays admitted; every reserved job from the first pick that is not one
    (a newcomer that ranks before it) on is given back: it is pending again at its old
    place, the store refunds its charge with the next call, and that call admits in the
    new order. Returns the jobs given back (``[]`` when the core would pick the same).

    Only when no store call is in flight and the store is in use normally (or absent);
    otherwise ``[]``, and the caller asks again later. O(reserved) core operations.
    """
    if not reserved or engine._inflight is not None or engine.state.mode not in _RECONSIDER:
        return []
    core = engine.core
    for uid in reserved:
        core.revert(uid)
    picks = core.schedule()
    mine = set(reserved)
    kept = 0
    while kept < len(picks) and picks[kept].uid in mine:
        kept += 1
    for admission in picks[kept:]:
        core.revert(admission.uid)
    if kept == len(reserved):
        return []
    stay = {a.uid for a in picks[:kept]}
    given = [uid for uid in reserved if uid not in stay]
    for uid in given:
        job = engine._jobs.get(uid)
        if job is not None:
            engine._give_back(uid, job, revert=False)
    engine.observer.given_back(len(given))
    return given


def vet(engine: Engine, reserved: list[Hashable]) -> Vetted:
    """Which admitted jobs that have not started (``reserved``) may start now.

    One the store admitted may start only while this worker's lease has surely held since
    its admission (see Leases in the package docstring). Otherwise the store may have
    released it and admitted a conflicting job on another worker: it is given back
    instead, pending again at its old place, and the next call reports it unstarted (its
    charge refunded; a stale token there changes nothing) and asks for it again. While a
    store call is in flight or the store is unreachable, such a job stays reserved and
    waits (it is vetted again once the store answers). Jobs admitted locally during an
    outage, and every job when there is no store, may start. O(reserved).
    """
    if engine.store is None:
        return Vetted(list(reserved), [])
    sound = engine.clock.now() - engine._contact < engine._held_for
    ready: list[Hashable] = []
    stale: list[Hashable] = []
    for uid in reserved:
        job = engine._jobs.get(uid)
        if job is None or not job.in_store or (sound and job.term == engine._term):
            ready.append(uid)
        else:
            stale.append(uid)
    if not stale or engine._inflight is not None or engine.state.mode is not Mode.SHARED:
        return Vetted(ready, [])
    for uid in stale:
        engine._give_back(uid, engine._jobs[uid])
    gave_back_stale(engine, stale)
    return Vetted(ready, stale)


def gave_back_stale(engine: Engine, given: list[Hashable]) -> None:
    engine.observer.given_back(len(given))
    logger.warning(
        "celery-fair: this worker's lease may have lapsed since it was admitted %d job(s) "
        "that have not started (it was paused, or could not reach the store, for %.1f s "
        "or more); giving them back to be admitted again: %s",
        len(given),
        engine._held_for,
        ", ".join(map(str, given[:5])),
    )
