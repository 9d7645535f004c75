"""The runs the gate has handed to the pool: what holds a slot, from hand-off to end.

A run is one request handed to Celery's path to the pool (fair or plain). It is known by its
``Request`` object, never by its task id, which Celery reuses (``Task.retry``,
``Task.replace``, duplicated messages): two runs of one task id hold a slot each, and each
gives it back when its own end comes (docs/operations.md#task-ids-celery-reuses).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from billiard.einfo import ExceptionInfo
from celery.utils.log import get_logger

from .internals import already_revoked, hit_time_limit, request_of

__all__ = ["Handoff", "Run", "Runs"]

logger = get_logger(__name__)


@dataclass(slots=True, eq=False)
class Run:
    """One request handed to the pool and not yet finished."""

    req: Any
    uid: str | None  # a fair job's uid (the engine's name for it); None for a plain task
    dispatched: float  # monotonic
    accepted: float | None = None
    applied: bool = False  # the pool took it (its apply_async call came)

    def elapsed(self, now: float) -> float:
        """Seconds from the pool process's acceptance (or the hand-off) to ``now`` (monotonic)."""
        return max(0.0, now - (self.accepted or self.dispatched))


class Runs:
    """The set of runs, with the counts the gate's capacity and ``inspect stats`` read.

    ``clock`` stamps each hand-off: monotonic seconds, on the base of the pool's accept times.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # _by_request: every run, by id() of its Request (each Run keeps its Request alive,
        # so no two runs share a key).
        self._by_request: dict[int, Run] = {}
        # fair: the uids of the fair runs; plain: how many runs are plain.
        self.fair: set[str] = set()
        self.plain = 0
        # in_line: runs the pool has not taken yet (waiting for Celery's semaphore).
        self.in_line = 0
        self.plain_started = 0  # plain runs there have been
        self._unnamed_warned = False

    def __len__(self) -> int:
        return len(self._by_request)

    def __iter__(self) -> Iterator[Run]:
        return iter(self._by_request.values())

    def fair_slots(self, pool_slots: int) -> int:
        """Of a pool of ``pool_slots``, the slots fair jobs may run in now: all but the plain
        runs'."""
        return max(0, pool_slots - self.plain)

    def add(self, req: Any, uid: str | None) -> Run:
        """A run of ``req`` about to be handed to the pool. O(1)."""
        run = self._by_request[id(req)] = Run(req, uid, self._clock())
        self.in_line += 1
        if uid is None:
            self.plain += 1
            self.plain_started += 1
        else:
            self.fair.add(uid)
        return run

    def taken(self, options: dict[str, Any]) -> Run | None:
        """The run a pool call is, now taken by the pool; ``None`` if it is not one of ours.

        By its Request (``request_of``); if Celery's call ever stops naming it, the oldest run
        of the same task id the pool has yet to take.
        """
        req = request_of(options)
        run = self._by_request.get(id(req)) if req is not None else self._by_task_id(options)
        if run is not None and not run.applied:
            run.applied = True
            self.in_line -= 1
        return run

    def _by_task_id(self, options: dict[str, Any]) -> Run | None:
        if not self._unnamed_warned:
            self._unnamed_warned = True
            logger.warning(
                "celery-fair: this Celery's pool calls do not name their request; matching runs "
                "by task id instead (a replaced or duplicated task id may then be miscounted)."
            )
        task_id = options.get("correlation_id")
        return next((r for r in self if not r.applied and r.req.id == task_id), None)

    def release(self, run: Run) -> bool:
        """``run`` ended (any outcome); ``False`` if it was already released. O(1)."""
        if self._by_request.get(id(run.req)) is not run:
            return False
        del self._by_request[id(run.req)]
        if not run.applied:
            self.in_line -= 1
        if run.uid is None:
            self.plain -= 1
        else:
            self.fair.discard(run.uid)
        return True

    def revoked_in_line(self) -> list[Run]:
        """Runs Celery revoked (or found expired) before the pool took them: Celery acked them
        and will never run them, so no pool callback will end them. O(runs)."""
        return [r for r in self if not r.applied and already_revoked(r.req)]


def wrap_callbacks(
    options: dict[str, Any], run: Run, finish: Callable[[Run, bool], None]
) -> dict[str, Any]:
    """``options`` of a pool call with its callbacks wrapped: the run's start is noted, and
    ``finish(run, timed)`` comes after Celery's own end callback, with ``timed`` true when the
    run's wall time measures the job (it ended, or hit its time limit; not a lost process)."""
    accept = options.get("accept_callback")
    done = options.get("callback")
    failed = options.get("error_callback")

    def on_accept(pid: Any, time_accepted: float) -> Any:
        run.accepted = time_accepted
        return accept(pid, time_accepted) if accept else None

    def on_done(result: Any) -> Any:
        try:
            return done(result) if done else None
        finally:
            # A BaseException in a thread reaches ``callback`` as an ExceptionInfo.
            finish(run, not isinstance(result, ExceptionInfo))

    def on_failed(einfo: Any) -> Any:
        try:
            return failed(einfo) if failed else None
        finally:
            finish(run, hit_time_limit(einfo))

    return {
        **options,
        "accept_callback": on_accept,
        "callback": on_done,
        "error_callback": on_failed,
    }


class Handoff:
    """How a gate's runs reach the pool, and how their ends come back to it, under the three
    threading regimes a worker has: an event loop with ends read on it (prefork), an event
    loop with ends on pool threads (threads), and green threads (gevent, eventlet).

    ``finished(run, elapsed, unstarted)`` is the gate's end of a run; ``consumer`` is the
    consumer to act through (its hub and timer), set again when it restarts.
    """

    def __init__(
        self,
        runs: Runs,
        process_task: Callable[[Any], Any],
        finished: Callable[[Run, float | None, bool], None],
        clock: Callable[[], float],
        *,
        consumer: Any,
        green: bool,
    ) -> None:
        self._runs = runs
        self._process_task = process_task
        self._finished = finished
        self._clock = clock
        self.consumer = consumer
        self._green = green
        self.loop_thread: int | None = None  # the thread the consumer runs its loop on
        self.closed = False  # the worker is shutting down: ends are taken where they come

    def hand(self, run: Run) -> None:
        """Hand ``run`` to the worker's own path to the pool; notice if it never got there."""
        req = run.req
        try:
            self._process_task(req)
        except Exception:
            logger.exception("Task %s[%s] could not be handed to the pool.", req.name, req.id)
            self._finished(run, None, False)
            return
        if not run.applied and already_revoked(req):
            # revoked (or expired) at the pool's door: Celery acked it; it never ran
            self._finished(run, None, True)

    def wrap_callbacks(self, options: dict[str, Any]) -> dict[str, Any]:
        """Wrap one ``apply_async`` call's callbacks to learn when its run starts and ends."""
        run = self._runs.taken(options)
        return options if run is None else wrap_callbacks(options, run, self._end_soon)

    def _end_soon(self, run: Run, timed: bool) -> None:
        elapsed = run.elapsed(self._clock()) if timed else None
        consumer = self.consumer
        hub = consumer.hub
        if self._green and not self.closed:
            # Still on the job's own greenlet, which holds its pool slot until it returns:
            # starting the next job from here would wait for that very slot. A fresh greenlet
            # (the timer's) does it once this one has ended.
            consumer.timer.call_after(0, self._finished, (run, elapsed, False))
        elif hub is None or self.closed or threading.get_ident() == self.loop_thread:
            # On the loop already (prefork's results are read there): release the slot and
            # start the next job in the same breath, as Celery releases its own semaphore.
            self._finished(run, elapsed, False)
        else:  # a pool thread (the threads pool): the loop does it
            hub.call_soon(self._finished, run, elapsed, False)
