"""Copies: a message for a job this worker holds, runs, or has already run to the end.

The broker delivers a message again when an ack timeout runs out or a connection drops; a
producer may publish one twice. Whichever copy the gate meets, one run is kept and the other
message is acknowledged, counted and logged here. Takes no lock: the gate calls it under its
own.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from celery.utils.log import get_logger
from celery.worker import state as worker_state

from ..observe import Observer
from .held import Held
from .internals import ack_quietly

__all__ = ["Copies", "FinishedHere"]

logger = get_logger(__name__)


class FinishedHere:
    """The uids of the fair jobs this worker ran to the end for good (message acknowledged)
    within the last ``horizon`` seconds (``fair_dedupe_seconds``, how long the shared store
    answers ``DONE`` to a late copy), at most ``limit`` of them, the newest kept.

    Only to say, when the store answers ``DONE``, whether the copy's job ran here or on
    another worker (worker ids are unique per process start, so "here" is exact). Beyond
    ``limit`` finishes in one horizon (333 a second with the defaults) the oldest are
    forgotten, and a copy of one of them is said to have run on another worker.
    ``add`` is O(1) amortised; ``in`` O(1).
    """

    __slots__ = ("_at", "clock", "horizon", "limit")

    def __init__(
        self, horizon: float, limit: int = 20_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.horizon = horizon
        self.limit = limit
        self.clock = clock
        # _at: uid -> when it finished here (clock), oldest first; every entry is younger
        # than ``horizon`` as of the last ``add``, and there are at most ``limit``.
        self._at: OrderedDict[str, float] = OrderedDict()

    def add(self, uid: str) -> None:
        now = self.clock()
        at = self._at
        at[uid] = now
        at.move_to_end(uid)
        while at and (len(at) > self.limit or next(iter(at.values())) <= now - self.horizon):
            at.popitem(last=False)

    def __contains__(self, uid: object) -> bool:
        when = self._at.get(uid)  # type: ignore[call-overload]
        return when is not None and when > self.clock() - self.horizon

    def __len__(self) -> int:
        return len(self._at)


class Copies:
    """What the gate does with a copy. ``untrack`` forgets task ids' tracked submissions
    (``None`` when submissions are not tracked)."""

    def __init__(
        self,
        observer: Observer,
        finished_here: FinishedHere,
        untrack: Callable[[list[str]], None] | None,
    ) -> None:
        self.observer = observer
        self.finished_here = finished_here
        self._untrack = untrack

    def while_held(self, earlier: Held, req: Any, uid: str) -> None:
        """``req`` is a new delivery of a message held as ``earlier`` (an ack timeout ran
        out): keep one, the newer delivery, at the place the first one had."""
        self.observer.duplicate()
        logger.warning(
            "Task %s[%s] was delivered again while held; keeping one copy.", req.name, uid
        )
        ack_quietly(earlier.req)
        earlier.req = req

    def while_running(self, req: Any, uid: str) -> None:
        """``req`` is a copy of job ``uid``, which runs here: drop it."""
        self.observer.duplicate()
        logger.warning(
            "Task %s[%s] was delivered again while running; dropping the copy.", req.name, uid
        )
        ack_quietly(req)

    def already_ran(self, held: Held, uid: str) -> None:
        """The store says held job ``uid`` already ran to the end (no longer held): drop
        this message, saying where its job ran."""
        self.observer.duplicate()
        logger.warning(
            "Task %s[%s] already ran to the end on %s; dropping this copy.",
            held.req.name,
            uid,
            "this worker" if uid in self.finished_here else "another worker",
        )
        ack_quietly(held.req)
        worker_state.task_ready(held.req)
        if self._untrack is not None:
            # The store drops a copy only once its job finished for good, and that end forgot
            # the job's entry; an entry now is this copy's own (its task id was published
            # again), and nothing else will end it. A copy dropped while its job still runs
            # (``while_running``) leaves the entry alone: it stands for the running job.
            self._untrack([held.req.id])
