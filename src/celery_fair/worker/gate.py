"""The gate: holds fair requests unacknowledged and starts them in fair order.

Every request the consumer would hand to the pool comes here first (normal, ETA-fired and
rate-limit-released alike; see bootstep.py). A plain task goes straight on but counts against
the slots. A fair job is *held*: submitted to the scheduling core and kept, unacknowledged,
until the core admits it; then it goes to the worker's own ``process_task``, exactly as Celery
would have sent it, so acks (early or late), time limits, events and revokes stay Celery's.

Held messages and the broker (docs/operations.md):

- *Prefetch.* A held message occupies a slot of the consumer's prefetch window, so the gate
  raises the window (``qos.increment_eventually``, as Celery does for ETA tasks) to stay
  ahead of what it holds, up to ``fair_max_held``; otherwise one client's burst would fill the
  window and hide every other client's messages. The raise always leaves room for at least one
  more message (the *lookahead*): ``acks_late`` tasks keep their messages unacked while they
  run, and a full pool would otherwise leave no room to see what arrives next. The window moves
  in chunks (grown by half, shrunk only when far too big) because on RabbitMQ every change is
  a ``basic.qos`` round trip to the broker.
- *Spill.* When the gate holds ``fair_max_held`` messages and a slot is free that none of them
  can take (they all wait for conflicts or caps), held work blocks the queue: the gate then
  returns the lowest-ranked tenth of what it holds to the broker (republish to the same
  exchange and routing key with every header kept, then ack), at most every
  ``fair_spill_interval``, so that the messages behind them can be seen; the spilled jobs keep
  their submission time and so their place in the fair order.
- *Ack timeouts.* A message held longer than ``max_hold`` (by default half the broker's ack
  timeout: Redis ``visibility_timeout``, RabbitMQ ``consumer_timeout``) is republished and
  acked the same way before the broker redelivers it or closes the channel.
- *Connection loss.* Held copies are forgotten without ack (their delivery tags died with the
  channel); the broker redelivers them.

Shared state (docs/store.md): decisions go through an ``Engine``. Alone (no store) the core
decides at once. With the Redis store, every admission is confirmed by one script call that
also carries the jobs that finished since the last one; with an event loop the call is sent
and its reply read when it arrives (``StoreLink``), one at a time, so the loop never waits for
Redis; without one the calls are made inline.

Threading: with an event loop (Redis, RabbitMQ) everything runs on the loop thread and pool
callbacks from other threads are marshalled onto it with ``hub.call_soon``; without one
(the in-memory transport, gevent, eventlet) the gate acts where it is called, under a lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from billiard.einfo import ExceptionInfo
from celery.concurrency.prefork import TaskPool as _PreforkPool
from celery.concurrency.thread import TaskPool as _ThreadPool
from celery.exceptions import TimeLimitExceeded
from celery.utils.log import get_logger
from celery.worker import state as worker_state

from ..core import Admission, JobType, ReserveDepth, Scheduler, WallClock
from ..engine import Call, Decision, Engine
from ..store.base import Store
from ..store.redis import RedisStore
from .headers import ERROR, REPUBLISHED, SUBMITTED, TOKEN, FairHeaders, parse_headers, request_uid
from .internals import ack_quietly, already_revoked, request_of, writes_pending
from .link import StoreLink

__all__ = ["Gate"]

logger = get_logger(__name__)

_LOOKAHEAD_POOLS = (_PreforkPool, _ThreadPool)

#: Fraction of the broker's ack timeout a message may be held before it is republished.
HOLD_FRACTION = 0.5
#: Seconds the RabbitMQ server waits for an ack by default (``consumer_timeout``).
RABBITMQ_CONSUMER_TIMEOUT = 1800.0
#: Seconds the Redis transport waits for an ack by default (``visibility_timeout``).
REDIS_VISIBILITY_TIMEOUT = 3600.0
#: Longest a store call waits for more events to share it while the pool's line is deep.
GATHER_SECONDS = 0.02
#: The deepest the adaptive reserve grows (``fair_lookahead`` unset, with a shared store).
RESERVE_MAX = 8


@dataclass(slots=True)
class Held:
    """A fair request waiting for admission."""

    req: Any
    received: float  # monotonic
    headers: FairHeaders
    arrival: float


@dataclass(slots=True)
class Started:
    """One run of a request: handed to the pool (fair or plain) and not yet finished.

    A run is known by its ``Request`` object, never by its task id, which Celery reuses
    (``Task.replace``, duplicated messages): two runs of one id hold a slot each.
    """

    req: Any
    uid: str | None  # a fair job's uid (the engine's name for it); None for a plain task
    dispatched: float  # monotonic
    accepted: float | None = None
    applied: bool = False  # the pool took it (its apply_async call came)


class Gate:
    """One worker's fair gate. Created by the consumer bootstep; one per consumer."""

    def __init__(
        self,
        consumer: Any,
        settings: Any,
        types: Mapping[str, JobType],
        process_task: Callable[[Any], Any],
        store: Store | None = None,
        worker_id: str = "worker",
    ) -> None:
        self.consumer = consumer
        self.app = consumer.app
        self.pool = consumer.pool
        self.settings = settings
        self.types = dict(types)
        self._groups = {name: t.conflict_group for name, t in self.types.items()}
        self.process_task = process_task
        # lookahead: jobs admitted beyond the free slots, kept in the gate's reserve until a
        # pool process frees, which then starts one with no store round trip in between. By
        # default, with a shared store, as many as cover ``fair_reserve_seconds`` of the
        # pool's work (1 to RESERVE_MAX, following the jobs' measured wall times); none alone
        # (the core decides at once there). Only for pools whose ends arrive on the event
        # loop (prefork, threads).
        lookahead_pool = isinstance(self.pool, _LOOKAHEAD_POOLS)
        self._sizer: ReserveDepth | None = None
        wanted = settings.lookahead
        if wanted is None:
            wanted = 0
            if store is not None and lookahead_pool:
                self._sizer = ReserveDepth(settings.reserve_seconds, minimum=1, maximum=RESERVE_MAX)
                wanted = self._sizer.minimum
        self.lookahead = wanted if lookahead_pool else 0
        if settings.lookahead and not self.lookahead:
            logger.warning(
                "fair_lookahead=%d is ignored: it is for the prefork and threads pools, not %s.",
                settings.lookahead,
                type(self.pool).__name__,
            )
        self.scheduler = Scheduler(
            settings.scheduler_config(self._slots() + self.lookahead),
            WallClock(),
            self.types.values(),
        )
        self.engine = Engine(
            self.scheduler,
            store,
            worker=worker_id,
            outage=settings.store_outage,
            poll_interval=settings.store_poll_interval,
        )
        self._runner: StoreLink | None = None
        self._hub: Any = None
        self._dirty = False  # something changed since the last store call was planned
        # _reserve: held jobs the store has admitted that wait for a free pool process, in
        # order of admission (each also stays in ``held``: its message is not acked). A
        # newcomer that goes well before one of them (``Scheduler.outranks``) sets _recheck:
        # before the next one starts, the engine is asked which of them keep their admission
        # (``Engine.reconsider``).
        self._reserve: dict[str, Admission] = {}
        self._recheck = False
        self._gather_timer: Any = None
        self._yielded = False  # the last turn let a job be written first (see _tick)
        # _in_line: jobs handed to Celery (fair or plain) that the pool has not taken yet.
        self._in_line = 0
        self._loop_thread: int | None = None  # the thread the consumer runs the loop on
        self._green = bool(getattr(self.pool, "is_green", False))  # gevent, eventlet
        self._closed = False
        # _pool_slots: the pool's size (autoscale moves it), read again by every sweep.
        self._pool_slots = self._slots()
        # held: fair requests not yet admitted, by task id, oldest first.
        self.held: dict[str, Held] = {}
        # started: runs handed to the pool and not finished, by id() of their Request (each
        # Started keeps its Request alive, so no two entries share a key).
        self.started: dict[int, Started] = {}
        # fair_running: the uids of the fair runs in ``started``.
        self.fair_running: set[str] = set()
        # nonfair_running: the plain runs in ``started``; plain_started: all there have been.
        self.nonfair_running = 0
        self.plain_started = 0
        # qos_raised: how much this gate has raised the prefetch window on this connection.
        # While fair work is inside (held or running), held + 1 <= qos_raised
        # <= max(8, 2 * (held + 1) + 16), capped at max_held + 1; once none has been inside
        # for a whole sweep interval, 0: the window is Celery's own (see _adjust_qos).
        self.qos_raised = 0
        self._fair_since_sweep = False  # a fair request came in since the last sweep
        self.max_hold = settings.max_hold_seconds or self._default_max_hold()
        self.counts = dict.fromkeys(
            ("admitted", "spilled", "refreshed", "dead_lettered", "revoked_held", "duplicates"), 0
        )
        self._lock = threading.RLock()
        self._unnamed_warned = False
        self._last_spill = -float("inf")
        self._revoked_seen = (-1, -1)
        self._sweep_entry: Any = None
        logger.info(
            "celery-fair gate ready: %d job type(s), max_held=%d, max_hold=%.0fs, state=%s, "
            "settings=%r",
            len(self.types),
            settings.max_held,
            self.max_hold,
            f"shared as {worker_id}" if store is not None else "this worker alone",
            settings.describe(),
        )

    # -- requests in -------------------------------------------------------------------

    def on_request(self, req: Any) -> None:
        """Take a request the consumer would start now (installed as ``on_task_request``)."""
        with self._lock:
            task = req.task
            declared = getattr(type(task), "job_type_name", None)
            parsed = parse_headers(
                req.request_dict,
                declared_type=declared() if declared else None,
                types=self._groups,
                default_key=self.settings.default_fairness_key,
                max_length=self.settings.max_header_length,
                reject_all=self.settings.on_bad_message == "reject",
            )
            if parsed is None:
                self._start_plain(req)
                return
            if parsed.problems:
                logger.warning(
                    "Task %s[%s] has bad fairness headers (%s); %s.",
                    req.name,
                    req.id,
                    "; ".join(map(str, parsed.problems)),
                    "sending it to the dead letter queue" if parsed.rejected else "repaired",
                )
            if parsed.rejected:
                self._dead_letter(req, "; ".join(map(str, parsed.problems)))
                return
            self._hold(req, parsed)
            scheduler = self.scheduler
            if scheduler.running < scheduler.capacity or self._runner is not None:
                self.dispatch()
            else:  # every slot is busy: nothing can start before a job ends (which dispatches)
                self._adjust_qos()

    def _hold(self, req: Any, parsed: FairHeaders) -> None:
        uid = request_uid(req.id, req.request_dict)
        self._fair_since_sweep = True
        earlier = self.held.get(uid)
        if earlier is not None:
            # The broker redelivered a message we hold (an ack timeout ran out): keep one, the
            # newer delivery, at the place the first one had.
            self.counts["duplicates"] += 1
            logger.warning(
                "Task %s[%s] was delivered again while held; keeping one copy.", req.name, uid
            )
            ack_quietly(earlier.req)
            earlier.req = req
            return
        if uid in self.fair_running:
            self.counts["duplicates"] += 1
            logger.warning(
                "Task %s[%s] was delivered again while running; dropping the copy.",
                req.name,
                uid,
            )
            ack_quietly(req)
            return
        arrival = parsed.submitted if parsed.submitted is not None else time.time()
        self.engine.submit(
            uid, parsed.job_type, parsed.job_id, parsed.fairness_key, arrival=arrival
        )
        self.held[uid] = Held(req, time.monotonic(), parsed, arrival)
        if self._reserve and not self._recheck:
            # Worth a store call only if the reserve would hold the newcomer up longer than
            # it is meant to hold anything: fair_reserve_seconds of the pool's work.
            tolerance = self.settings.reserve_seconds * self._pool_slots
            self._recheck = self.scheduler.outranks(uid, self._reserve.values(), tolerance)

    def _start_plain(self, req: Any) -> None:
        self.nonfair_running += 1
        self.plain_started += 1
        self._handoff(self._run(req, None))

    def _run(self, req: Any, uid: str | None) -> Started:
        """Record a run of ``req`` about to be handed to the pool."""
        info = self.started[id(req)] = Started(req, uid, time.monotonic())
        self._in_line += 1
        return info

    # -- decisions -----------------------------------------------------------------------

    def dispatch(self) -> None:
        """Start every held job that may start now. O(admitted), independent of held jobs.

        Alone, the core decides here and now. With a shared store on an event loop, this only
        notes that something changed: the loop's next turn makes one store call for all that
        changed during this turn (``_tick``), and the jobs start when its answer comes back.
        """
        with self._lock:
            if self._reserve:
                self._hand_reserved()
            capacity = max(0, self._pool_slots - self.nonfair_running) + self.lookahead
            if capacity != self.scheduler.capacity:
                self.scheduler.set_capacity(capacity)
            if self._runner is None:
                decision = self.engine.run_inline()
                if decision.start or decision.drop:
                    self._act(decision)
            else:
                self._dirty = True
            self._adjust_qos()

    def _tick(self) -> None:
        """Once per turn of the event loop, before it polls: the store call this turn needs.

        A job Celery has just handed to the prefork pool is written to its process only after
        this turn's poll; the store call, which wakes Redis and may yield the CPU to it, waits
        one turn so the job goes first. While a call is in flight there is nothing to decide:
        its reply dispatches again.
        """
        if not self._dirty or self._gathering() or self.engine.busy:
            return
        if not self._yielded and writes_pending(self.pool):
            self._yielded = True
            return
        self._yielded = False
        self._call_store()

    def _gathering(self) -> bool:
        """Let events gather for one store call while the pool's line is deeper than its
        refill mark (a third of a lookahead of 3 or more): the pool stays busy meanwhile, and
        one call then reports several finished jobs and admits as many. Never longer than
        ``GATHER_SECONDS``."""
        mark = self.lookahead // 3
        if mark and len(self._reserve) + self._in_line > mark:
            if self._gather_timer is None:
                self._gather_timer = self._hub.call_later(GATHER_SECONDS, self._gather_over)
            return True
        self._cancel_gather()
        return False

    def _cancel_gather(self) -> None:
        if self._gather_timer is not None:
            self._gather_timer.cancel()
            self._gather_timer = None

    def _gather_over(self) -> None:
        self._gather_timer = None
        if self._dirty:
            self._call_store()

    def _call_store(self) -> None:
        with self._lock:
            self._dirty = False
            runner = self._runner
            if runner is None:
                return
            decision = self.engine.decide()
            if decision.start or decision.drop:
                self._act(decision)
            if decision.call is not None:
                runner.submit(decision.call)

    def on_reply(self, call: Call, result: Any) -> None:
        """A store call came back (on the loop): act on it, then decide again."""
        with self._lock:
            decision = self.engine.apply(call, result)
            if decision.start or decision.drop:
                self._act(decision)
            self.dispatch()

    def _act(self, decision: Decision) -> None:
        for admission in decision.start:
            uid = str(admission.ref)
            if uid not in self.held:  # forgotten while the store decided: let its slot go
                self.engine.finish(uid, None, unstarted=True)
                continue
            self.counts["admitted"] += 1
            if len(self.started) < self._pool_slots:
                self._start(uid, admission)
            else:
                self._reserve[uid] = admission
        for ref in decision.drop:
            uid = str(ref)
            held = self.held.pop(uid, None)
            if held is None:
                continue
            self.counts["duplicates"] += 1
            logger.warning(
                "Task %s[%s] already ran to the end on another worker; dropping this copy.",
                held.req.name,
                uid,
            )
            ack_quietly(held.req)
            worker_state.task_ready(held.req)

    def _start(self, uid: str, admission: Admission) -> None:
        """Hand an admitted job to the pool."""
        req = self.held.pop(uid).req
        info = self._run(req, uid)
        self.fair_running.add(uid)
        req.request_dict[TOKEN] = admission.token
        logger.debug(
            "Admitted %s[%s] job_type=%s job_id=%s fairness_key=%s estimate=%.3f token=%d",
            req.name,
            uid,
            admission.type,
            admission.job_id,
            admission.fairness_key,
            admission.estimate,
            admission.token,
        )
        self._handoff(info)

    def _hand_reserved(self) -> None:
        """Start reserved jobs on free pool processes, unless a newcomer may go first."""
        if self._recheck:
            if self.engine.busy:
                return  # asked again when the store answers (on_reply dispatches)
            self._recheck = False
            # Those given back are pending again: dispatch's next decision admits them and
            # the newcomer that ranks before them, in the new order.
            for uid in self.engine.reconsider(list(self._reserve)):
                del self._reserve[str(uid)]
        reserve = self._reserve
        while reserve and len(self.started) < self._pool_slots:
            uid = next(iter(reserve))
            self._start(uid, reserve.pop(uid))

    def _handoff(self, info: Started) -> None:
        """Hand a run to the worker's own path to the pool; notice if it never got there."""
        req = info.req
        try:
            self.process_task(req)
        except Exception:
            logger.exception("Task %s[%s] could not be handed to the pool.", req.name, req.id)
            self._finished(info, None)
            return
        if not info.applied and already_revoked(req):
            self._finished(info, None)  # revoked at the pool's door: Celery acked it

    def _slots(self) -> int:
        """The pool's size now (autoscale moves it), or ``fair_capacity`` if smaller."""
        pool = self.pool
        try:
            size = int(pool.num_processes or 0)
        except AttributeError:  # prefork before its processes exist
            size = int(getattr(pool, "limit", 0) or 0)
        capacity = self.settings.capacity
        return size if capacity is None else min(capacity, size) if size else capacity

    # -- pool callbacks ------------------------------------------------------------------

    def wrap_callbacks(self, args: Any, options: dict[str, Any]) -> dict[str, Any]:
        """Wrap one ``apply_async`` call's callbacks to learn when its run starts and ends.

        ``args`` are the trace arguments Celery gives the pool: (type, task id, request, ...).
        """
        info = self._run_of(args, options)
        if info is None:
            return options
        if not info.applied:
            info.applied = True
            self._in_line -= 1
        accept = options.get("accept_callback")
        done = options.get("callback")
        failed = options.get("error_callback")

        def on_accept(pid: Any, time_accepted: float) -> Any:
            info.accepted = time_accepted
            return accept(pid, time_accepted) if accept else None

        def on_done(result: Any) -> Any:
            try:
                return done(result) if done else None
            finally:
                # A BaseException in a thread reaches ``callback`` as an ExceptionInfo.
                self._finish_soon(info, observe=not isinstance(result, ExceptionInfo))

        def on_failed(einfo: Any) -> Any:
            try:
                return failed(einfo) if failed else None
            finally:
                exc = getattr(einfo, "exception", None)
                self._finish_soon(info, observe=isinstance(exc, TimeLimitExceeded))

        return {
            **options,
            "accept_callback": on_accept,
            "callback": on_done,
            "error_callback": on_failed,
        }

    def _run_of(self, args: Any, options: dict[str, Any]) -> Started | None:
        """The run a pool call is: by its Request (``request_of``); if Celery's call ever stops
        naming it, the oldest run of the same task id the pool has yet to take."""
        req = request_of(options)
        if req is not None:
            return self.started.get(id(req))
        task_id = options.get("correlation_id")
        if not self._unnamed_warned:
            self._unnamed_warned = True
            logger.warning(
                "celery-fair: this Celery's pool calls do not name their request; matching runs "
                "by task id instead (a replaced or duplicated task id may then be miscounted)."
            )
        return next(
            (i for i in self.started.values() if not i.applied and i.req.id == task_id), None
        )

    def _finish_soon(self, info: Started, *, observe: bool) -> None:
        elapsed = None
        if observe:
            elapsed = max(0.0, time.monotonic() - (info.accepted or info.dispatched))
        hub = self.consumer.hub
        if self._green and not self._closed:
            # Still on the job's own greenlet, which holds its pool slot until it returns:
            # starting the next job from here would wait for that very slot. A fresh greenlet
            # (the timer's) does it once this one has ended.
            self.consumer.timer.call_after(0, self._finished, (info, elapsed))
        elif hub is None or self._closed or threading.get_ident() == self._loop_thread:
            # On the loop already (prefork's results are read there): release the slot and
            # start the next job in the same breath, as Celery releases its own semaphore.
            self._finished(info, elapsed)
        else:  # a pool thread (the threads pool): the loop does it
            hub.call_soon(self._finished, info, elapsed)

    def _finished(self, info: Started, elapsed: float | None) -> None:
        """A run handed to the pool is done (any outcome): release its slot; learn if timed."""
        with self._lock:
            if self.started.get(id(info.req)) is not info:
                return  # already released
            del self.started[id(info.req)]
            if not info.applied:
                self._in_line -= 1
            uid = info.uid
            if uid is None:
                self.nonfair_running -= 1
            else:
                self.fair_running.discard(uid)
                # Acknowledged means the broker will not deliver it again: the store may then
                # recognise a late copy of its message.
                final = bool(getattr(info.req, "acknowledged", False))
                self.engine.finish(uid, elapsed, final=final)
                sizer = self._sizer
                if elapsed is not None and sizer is not None:
                    # The reserve follows the jobs' wall times; the dispatch below applies a
                    # new depth to the core's capacity (reserved jobs beyond a smaller depth
                    # keep their admission).
                    sizer.observe(elapsed)
                    self.lookahead = sizer.depth(self._pool_slots)
            if self._closed:
                self.engine.flush()
            else:
                self.dispatch()

    # -- housekeeping --------------------------------------------------------------------

    def sweep(self) -> None:
        """Periodic: drop revoked and expired holds, refresh old holds, follow the pool size,
        and spill if held work blocks the queue."""
        with self._lock:
            blocking = self._is_blocking()  # as the last decision left things
            self._pool_slots = self._slots()
            self._drop_revoked()
            self._release_revoked_in_line()
            self._refresh_old_holds()
            self.dispatch()
            if blocking:
                self._spill()
            self._close_idle_window()

    def _release_revoked_in_line(self) -> None:
        """Release admitted jobs that Celery revoked (or found expired) while they waited in
        line for a pool slot (``fair_lookahead``): Celery acked them and will never run them,
        so no pool callback would. O(jobs handed to the pool)."""
        gone = [i for i in self.started.values() if not i.applied and already_revoked(i.req)]
        for info in gone:
            self._finished(info, None)

    def _is_blocking(self) -> bool:
        """Held work blocks the queue: the window is full (``fair_max_held``) and a slot is free
        that no held job can take (all wait for conflicts or caps), so messages behind them in
        the broker, which might run now, cannot be seen. While every slot is busy, nothing is
        blocked: held jobs start as fast as slots free up, and the window moves with them.
        """
        scheduler = self.scheduler
        return (
            len(self.held) >= self.settings.max_held
            and scheduler.running < scheduler.capacity
            and not self._dirty  # a decision is due: the free slot may be taken at once
            and not self.engine.busy  # the store is deciding: the same
        )

    def _drop_revoked(self) -> None:
        marker = (len(worker_state.revoked), len(getattr(worker_state, "revoked_stamps", ())))
        if marker == self._revoked_seen and not any(h.req.expires for h in self.held.values()):
            return
        self._revoked_seen = marker
        for uid, held in list(self.held.items()):
            # revoked() also handles expiry, and does Celery's bookkeeping: ack, events, state.
            if held.req.revoked():
                self._forget(uid)
                self.counts["revoked_held"] += 1
                logger.info(
                    "Held task %s[%s] was revoked or expired; dropped from the gate.",
                    held.req.name,
                    uid,
                )

    def _refresh_old_holds(self) -> None:
        deadline = time.monotonic() - self.max_hold
        for held in list(self.held.values()):
            if held.received > deadline:
                break  # held is ordered by receipt
            if self._republish(held, reason="held longer than the broker waits for an ack"):
                self.counts["refreshed"] += 1

    def _spill(self) -> None:
        now = time.monotonic()
        if now - self._last_spill < self.settings.spill_interval:
            return
        self._last_spill = now
        pending = [v for v in self.scheduler.snapshot().jobs if v.place is not None]
        victims = pending[-max(1, len(pending) // 10) :]
        spilled = 0
        for view in reversed(victims):
            held = self.held.get(view.ref)  # type: ignore[call-overload]
            if held is not None and self._republish(held, reason="held work blocks the queue"):
                spilled += 1
        self.counts["spilled"] += spilled
        logger.warning(
            "celery-fair holds %d messages (fair_max_held=%d) and none of them can take a free "
            "slot: returned the %d lowest-ranked to the broker.",
            len(self.held) + spilled,
            self.settings.max_held,
            spilled,
        )

    def _forget(self, uid: str) -> None:
        self._drop_held(uid)
        self._adjust_qos()

    def _drop_held(self, uid: str) -> None:
        """Stop holding ``uid``: withdraw it, or give its admission back if it was reserved."""
        self.held.pop(uid, None)
        if self._reserve.pop(uid, None) is not None:
            self.engine.finish(uid, None, unstarted=True)
        else:
            self.engine.cancel(uid)

    def _adjust_qos(self) -> None:
        """Keep the prefetch window ahead of what is held, moving it in chunks.

        Only while fair work is inside: a worker with none prefetches what Celery would
        (``_close_idle_window`` gives the raise back).
        """
        qos = self.consumer.qos
        if qos is None or not (self.held or self.fair_running):
            return
        cap = self.settings.max_held + 1
        need = min(len(self.held) + 1, cap)
        raised = self.qos_raised
        if need > raised:
            target = min(cap, max(8, need + need // 2))
            qos.increment_eventually(target - raised)
        elif raised > max(8, 2 * need + 16):
            target = max(8, need + need // 2)
            qos.decrement_eventually(raised - target)
        else:
            return
        self.qos_raised = target

    def _close_idle_window(self) -> None:
        """From the sweep: once no fair request has been inside for a whole sweep interval,
        give the window's raise back. Waiting that long spares a trickle of fair jobs a
        ``basic.qos`` round trip (RabbitMQ) on every arrival and every end."""
        idle = not (self.held or self.fair_running or self._fair_since_sweep)
        self._fair_since_sweep = False
        qos = self.consumer.qos
        if idle and self.qos_raised and qos is not None:
            qos.decrement_eventually(self.qos_raised)
            self.qos_raised = 0

    def on_connected(self) -> None:
        """A new connection (and QoS): open the lookahead if fair work is running."""
        self._loop_thread = threading.get_ident()
        with self._lock:
            self.qos_raised = 0
            self._adjust_qos()

    def on_connection_lost(self) -> None:
        """The channel is gone: held copies cannot be acked and will be redelivered."""
        with self._lock:
            if self.held:
                logger.info(
                    "Connection lost: forgetting %d held message(s); the broker "
                    "will deliver them again.",
                    len(self.held),
                )
            for uid in list(self.held):
                self._drop_held(uid)
            self.qos_raised = 0  # a new connection gets a new QoS

    def start_link(self, hub: Any) -> None:
        """With an event loop, make store calls on it without blocking it (see link.py).

        Without one, or with a store the link cannot drive (Redis Cluster), calls are made
        inline, which blocks for one round trip each.
        """
        store = self.engine.store
        if self._runner is not None or hub is None or not StoreLink.supports(store):
            return
        assert isinstance(store, RedisStore)
        self._runner = StoreLink(store, hub, self.on_reply)
        self._hub = hub
        hub.on_tick.add(self._tick)
        self._dirty = True

    def close(self) -> None:
        """The worker is shutting down: report what finished; later finishes are reported inline.

        A store call still in flight is abandoned; if it admitted jobs, they are released
        when this worker's lease expires.
        """
        with self._lock:
            self._closed = True
            runner, self._runner = self._runner, None
            self._cancel_gather()
            if runner is not None:
                runner.close()
                self._hub.on_tick.discard(self._tick)
            for uid in list(self._reserve):  # never started: their messages come back
                self._drop_held(uid)
            self.engine.flush()

    # -- republishing --------------------------------------------------------------------

    def _republish(self, held: Held, *, reason: str) -> bool:
        """Put a held message back on its queue (all headers kept), then ack it."""
        req = held.req
        message = req._message
        headers = dict(message.headers or {})
        headers.pop("compression", None)  # the body was decompressed on receipt
        headers.setdefault(SUBMITTED, held.arrival)  # keep its place in the fair order
        headers[REPUBLISHED] = int(headers.get(REPUBLISHED) or 0) + 1
        info = message.delivery_info or {}
        try:
            self._publish(message, headers, info.get("exchange") or "", info.get("routing_key"))
        except Exception:
            logger.exception(
                "Could not return held task %s[%s] to the broker (%s); still holding it.",
                req.name,
                req.id,
                reason,
            )
            return False
        message.ack()
        worker_state.task_ready(req)
        self._forget(request_uid(req.id, req.request_dict))
        logger.info("Returned held task %s[%s] to the broker: %s.", req.name, req.id, reason)
        return True

    def _dead_letter(self, req: Any, why: str) -> None:
        message = req._message
        headers = dict(message.headers or {})
        headers.pop("compression", None)
        headers[ERROR] = why
        queue = self.settings.dead_letter_queue
        try:
            self._publish(message, headers, "", queue, declare_queue=queue)
        except Exception:
            logger.exception(
                "Could not dead-letter task %s[%s]; rejecting it instead.", req.name, req.id
            )
            req.reject(requeue=False)
            return
        self.counts["dead_lettered"] += 1
        req.acknowledge()
        worker_state.task_ready(req)
        req.send_event("task-rejected", requeue=False)
        logger.error("Task %s[%s] sent to dead letter queue %r: %s", req.name, req.id, queue, why)

    def _publish(
        self,
        message: Any,
        headers: dict[str, Any],
        exchange: str,
        routing_key: str | None,
        declare_queue: str | None = None,
    ) -> None:
        from kombu.entity import Queue

        props = message.properties or {}
        declare = [Queue(declare_queue, durable=True)] if declare_queue else None
        with self.app.producer_or_acquire() as producer:
            producer.publish(
                message.body,
                exchange=exchange,
                routing_key=routing_key,
                headers=headers,
                content_type=message.content_type,
                content_encoding=message.content_encoding,
                delivery_mode=props.get("delivery_mode"),
                priority=props.get("priority"),
                correlation_id=props.get("correlation_id"),
                reply_to=props.get("reply_to"),
                declare=declare,
                retry=True,
            )

    # -- inspection ----------------------------------------------------------------------

    def pool_info(self) -> dict[str, Any]:
        """Flat statistics for ``inspect stats`` (Flower shows them on the pool tab)."""
        with self._lock:
            return {
                "fair-held": len(self.held),
                "fair-reserved": len(self._reserve),
                "fair-lookahead": self.lookahead,
                "fair-running": self.scheduler.running,
                "plain-running": self.nonfair_running,
                "plain-started": self.plain_started,
                "pool-in-line": self._in_line,
                "fair-capacity": self.scheduler.capacity,
                **{f"fair-{name.replace('_', '-')}": n for name, n in self.counts.items()},
                **{f"fair-store-{name}": v for name, v in self.engine.info().items()},
            }

    def _default_max_hold(self) -> float:
        conf = self.app.conf
        driver = self.app.connection_for_read().transport.driver_type
        if driver == "redis":
            options = conf.broker_transport_options or {}
            timeout = float(options.get("visibility_timeout", REDIS_VISIBILITY_TIMEOUT))
        elif driver == "amqp":
            timeout = RABBITMQ_CONSUMER_TIMEOUT
        else:
            return float("inf")
        return timeout * HOLD_FRACTION
