"""The gate's reserve: jobs the store has admitted that wait for a free pool process.

With a shared store, a worker admits a few jobs beyond its free processes (its *lookahead*),
so that a process that frees starts the next one with no store round trip in between. Each
reserved job stays held (its message unacked) until it starts. Two rules keep the reserve
honest:

- *A newcomer may go first.* A job that arrives ranked well before the reserved ones
  (``Scheduler.outranks``, beyond ``fair_reserve_seconds`` of the pool's work) sets
  ``recheck``: before the next reserved job starts, the engine is asked which of them keep
  their admission (``Engine.reconsider``); those given back are pending again.
- *An admission must surely still hold.* A reserved job starts only while its worker's lease
  surely held since its admission (``Engine.vet``); the engine gives back the others.

``plan_reserve`` says how deep the reserve is: a fixed ``fair_lookahead``, or by default with a
shared store a depth that follows the jobs' wall times (``core.ReserveDepth``).
It takes no lock of its own: the gate calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from celery.utils.log import get_logger

from ..core import Admission, ReserveDepth, Scheduler
from ..engine import Engine
from .internals import ends_on_loop, pool_size

__all__ = ["RESERVE_MAX", "Reserve", "plan_reserve", "slots_of"]

logger = get_logger(__name__)

#: The deepest the adaptive reserve grows (``fair_lookahead`` unset, with a shared store).
RESERVE_MAX = 8


class Reserve:
    """Admitted jobs waiting for a free process, in order of admission, and how many to keep.

    ``lookahead`` is how many jobs may be admitted beyond the pool's free processes; with a
    ``sizer`` it follows the jobs' wall times (``observe``).
    """

    def __init__(self, lookahead: int = 0, sizer: ReserveDepth | None = None) -> None:
        # admitted: uid -> its admission, for every held job the engine admitted that has not
        # been handed to the pool; each is also in the gate's held jobs.
        self.admitted: dict[str, Admission] = {}
        self.lookahead = lookahead
        self.sizer = sizer
        # recheck: a job held since the last reconsider may rank before the reserved ones.
        self.recheck = False

    def __len__(self) -> int:
        return len(self.admitted)

    def __contains__(self, uid: object) -> bool:
        return uid in self.admitted

    def __iter__(self) -> Iterator[str]:
        return iter(self.admitted)

    @property
    def adaptive(self) -> bool:
        """Whether the depth follows the jobs' wall times."""
        return self.sizer is not None

    def add(self, uid: str, admission: Admission) -> None:
        self.admitted[uid] = admission

    def pop(self, uid: str) -> Admission | None:
        return self.admitted.pop(uid, None)

    def refill_mark(self) -> int:
        """How few jobs waiting for the pool (reserved, or in the pool's line) are worth a
        store call at once: a third of a lookahead of 3 or more, else 0 (always)."""
        return self.lookahead // 3

    def newcomer(self, scheduler: Scheduler, uid: str, tolerance: float) -> None:
        """Job ``uid`` was just held: worth a reconsider if the reserve would hold it up longer
        than ``tolerance`` seconds of the pool's work. O(log held)."""
        if self.admitted and not self.recheck:
            self.recheck = scheduler.outranks(uid, self.admitted.values(), tolerance)

    def startable(self, engine: Engine, room: bool) -> list[str]:
        """The reserved jobs that may start now, in order (``room``: a process is free).

        First, if a newcomer may rank before them and the engine can say, those it gives back
        leave the reserve (pending again: the next decision admits in the new order); while
        the store decides, nothing starts (asked again when it answers). Then, if there is
        room, only those whose admission surely still holds (``Engine.vet``); the engine gives
        back the others, or keeps them waiting for the store. The caller starts them while
        processes are free, popping each."""
        admitted = self.admitted
        if self.recheck:
            if engine.busy:
                return []
            self.recheck = False
            for uid in engine.reconsider(list(admitted)):
                del admitted[str(uid)]
        if not admitted or not room:
            return []
        vetted = engine.vet(list(admitted))
        for uid in vetted.given_back:
            del admitted[str(uid)]
        return [str(uid) for uid in vetted.ready]

    def observe(self, elapsed: float, slots: int) -> None:
        """A fair job ran ``elapsed`` seconds on a pool of ``slots``: with a sizer, the depth
        follows (reserved jobs beyond a smaller depth keep their admission)."""
        sizer = self.sizer
        if sizer is not None:
            sizer.observe(elapsed)
            self.lookahead = sizer.depth(slots)


def slots_of(pool: Any, settings: Any) -> int:
    """The pool's size now (autoscale moves it), or ``fair_capacity`` if smaller."""
    size = pool_size(pool)
    capacity = settings.capacity
    return size if capacity is None else min(capacity, size) if size else capacity


def plan_reserve(settings: Any, pool: Any, *, shared: bool) -> tuple[int, ReserveDepth | None]:
    """The reserve's lookahead for ``pool``, and what sizes it if it follows the jobs' wall
    times.

    By default, with a shared store, as many as cover ``fair_reserve_seconds`` of the pool's
    work (1 to RESERVE_MAX, following the jobs' measured wall times); none alone (the core
    decides at once there). Only for pools whose ends arrive on the event loop (prefork,
    threads).
    """
    lookahead_pool = ends_on_loop(pool)
    sizer: ReserveDepth | None = None
    wanted = settings.lookahead
    if wanted is None:
        wanted = 0
        if shared and lookahead_pool:
            sizer = ReserveDepth(settings.reserve_seconds, minimum=1, maximum=RESERVE_MAX)
            wanted = sizer.minimum
    lookahead = wanted if lookahead_pool else 0
    if settings.lookahead and not lookahead:
        logger.warning(
            "fair_lookahead=%d is ignored: it is for the prefork and threads pools, not %s.",
            settings.lookahead,
            type(pool).__name__,
        )
    return lookahead, sizer
