"""The gate: holds fair requests unacknowledged and starts them in fair order.

Every request the consumer would hand to the pool comes here first (normal, ETA-fired and
rate-limit-released alike; see bootstep.py). A plain task goes straight on but counts against
the slots. A fair job is *held*: submitted to the scheduling core and kept, unacknowledged,
until the core admits it; then it goes to the worker's own ``process_task``, exactly as Celery
would have sent it, so acks (early or late), time limits, events and revokes stay Celery's.

Held messages and the broker (docs/operations.md):

- *Prefetch.* A held message occupies a slot of the consumer's prefetch window, so while fair
  work is inside, the gate keeps the window ahead of what it holds (window.py); with none
  inside, the window is Celery's own. With shards on Redis it holds only what it can start
  plus one per shard, and on RabbitMQ each shard's consumer gets a window of what it can
  start plus one (consumer_prefetch.py), unless held jobs leave a slot free (they wait for
  conflicts or caps): then it takes more in, up to ``fair_max_held``, to find one that can run.
- *Spill.* When the gate holds ``fair_max_held`` messages and a slot is free that none of them
  can take (they all wait for conflicts or caps), held work blocks the queue: the gate then
  returns the lowest-ranked tenth of what it holds to the broker (returns.py: republish to the
  same exchange and routing key with every header kept, then ack), at most every
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

Runs handed to the pool, and their ends, are counted per request (runs.py); what the gate
reads of Celery's insides is in internals.py.

Threading: with an event loop (Redis, RabbitMQ) everything runs on the loop thread and pool
callbacks from other threads are marshalled onto it with ``hub.call_soon``; without one
(the in-memory transport, gevent, eventlet) the gate acts where it is called, under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from celery.utils.log import get_logger
from celery.worker import state as worker_state

from .. import words
from ..connect import untrack
from ..core import (
    Admission,
    BlockReason,
    JobType,
    PriorityOutcome,
    ReserveDepth,
    Scheduler,
    WallClock,
)
from ..core.clock import Clock, MonotonicClock
from ..core.inspect import Why, why_to_dict
from ..core.types import check_priority
from ..engine import LATER, Call, Decision, Driver, Engine
from ..metrics import GateLook, top_allocations
from ..observe import Counters, Fanout, Observer
from ..routing import shard_of
from ..store.base import Store, conflict_field
from ..store.redis import RedisStore
from .consumer_prefetch import ShardWindows
from .episodes import Episodes
from .events import attach
from .headers import (
    PAUSED_SPILL,
    PRIORITY,
    SUBMITTED,
    TOKEN,
    FairHeaders,
    parse_headers,
    request_uid,
)
from .internals import (
    ack_quietly,
    already_revoked,
    ends_on_loop,
    pool_size,
    revoked_marker,
    sends_events,
    writes_pending,
)
from .link import StoreLink
from .returns import dead_letter, return_to_queue
from .runs import FinishedHere, Run, Runs, wrap_callbacks
from .shard_turns import ShardTurns
from .window import PrefetchWindow

__all__ = ["Gate"]

logger = get_logger(__name__)

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
#: Seconds without a bounded header (headers.py) after which the next one is logged again.
BOUNDED_QUIET_SECONDS = 300.0
#: What the gate does with a header out of bounds, for its warning.
BOUNDED_OUTCOME = {
    SUBMITTED: "its wait counts from fair_submitted_horizon_seconds before its receipt",
    PRIORITY: "it runs at its type's priority",
}
#: How many priorities given to jobs this worker does not have it remembers (Gate.reprioritize),
#: for when they arrive: as many task ids as Celery's revoked set keeps by default.
REMEMBERED = 50_000


@dataclass(slots=True)
class Held:
    """A fair request waiting for admission."""

    req: Any
    received: float  # monotonic
    headers: FairHeaders
    arrival: float
    events: dict[str, Any] | None = None  # the fields its task events carry (events.py)
    shard: int = -1  # the shard of its fairness key, counted by ShardTurns (-1: not counted)
    priority: int | None = None  # its own priority, if not its type's


class Gate:
    """One worker's fair gate. Created by the consumer bootstep; one per consumer."""

    def __init__(
        self,
        consumer: Any,
        settings: Any,
        types: Mapping[str, JobType],
        process_task: Callable[[Any], Any],
        *,
        scheduler: Scheduler,
        engine: Engine,
        counters: Counters,
        observer: Observer,
        driver: str,
        lookahead: int = 0,
        sizer: ReserveDepth | None = None,
        wall: Clock,
        monotonic: Clock,
        worker_id: str = "worker",
    ) -> None:
        """A gate over parts it is given (``for_worker`` builds them for a real worker).

        ``scheduler`` has ``lookahead`` places beyond the pool's slots and reads ``wall``;
        ``engine`` decides over it and the store (``engine.store``: ``None`` alone);
        ``counters`` are what ``inspect stats`` shows, and ``observer`` is what the engine
        reports to (the counters among its listeners). ``driver`` is the broker transport's
        (``"redis"``, ``"amqp"``, ...). ``sizer``: the reserve's depth follows the jobs' wall
        times. ``wall`` reads epoch seconds, as producers stamp ``fair_submitted``;
        ``monotonic`` reads the intervals and deadlines (holds, spills, waits, runs; the same
        base as the pool's accept times, ``time.monotonic`` in a real worker).
        """
        self.consumer = consumer
        self.app = consumer.app
        self.pool = consumer.pool
        self.settings = settings
        self.types = dict(types)
        self._wall = wall
        self._monotonic = monotonic
        self._groups = {name: t.conflict_group for name, t in self.types.items()}
        # _declared: the priorities a job's own fair_priority may take (headers.py repairs
        # any other to its type's); _bounds: when each bounded header was last repaired, so
        # that a producer sending them logs one warning per episode, not one per message.
        self._declared = settings.declared_priorities(self.types.values())
        self._bounds = Episodes(BOUNDED_QUIET_SECONDS)
        self.process_task = process_task
        # lookahead: jobs admitted beyond the free slots, kept in the gate's reserve until a
        # pool process frees, which then starts one with no store round trip in between
        # (plan_reserve says how many).
        self._sizer = sizer
        self.lookahead = lookahead
        self.scheduler = scheduler
        # counters: what inspect stats shows; observer: every event goes to it, the counters
        # among its listeners (observe.py).
        self.counters = counters
        self.observer = observer
        self.engine = engine
        self._runner: StoreLink | None = None
        # With a store link (start_link): the one engine loop, its calls handed to the link,
        # whose replies come back through on_reply. Always under the gate's lock.
        self._engine_loop = Driver(self.engine, self._act_on, execute=self._hand_to_link)
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
        self._loop_thread: int | None = None  # the thread the consumer runs the loop on
        self._green = bool(getattr(self.pool, "is_green", False))  # gevent, eventlet
        self._closed = False
        # _pool_slots: the pool's size (autoscale moves it), read again by every sweep.
        self._pool_slots = self._slots()
        # held: fair requests not yet admitted, by uid, oldest first.
        self.held: dict[str, Held] = {}
        # _uids: task id -> uid for the held and running jobs whose uid is not their task id
        # (a retry, a replacement), so that job control finds a job by its task id in O(1).
        self._uids: dict[str, str] = {}
        # _priorities: task id -> the priority job control gave a job this worker did not have
        # (still in the broker, or held elsewhere), oldest first, taken if it comes here.
        self._priorities: dict[str, int | None] = {}
        self.held_peak = 0  # the most held at once since the worker started
        # runs: requests handed to the pool (fair or plain) and not finished.
        self.runs = Runs(monotonic.now)
        # finished_here: the fair jobs this worker ended for good lately, to say where a late
        # copy's job ran when the store drops the copy.
        self.finished_here = FinishedHere(settings.dedupe_seconds, clock=monotonic.now)
        self.window = PrefetchWindow(lambda: self.consumer.qos, settings.max_held)
        # shard_windows: each shard consumer's own window on RabbitMQ (consumer_prefetch.py),
        # given on each connection (attach).
        self.shard_windows: ShardWindows | None = None
        self._driver = driver
        # turns: held messages per shard, which order the Redis transport's reads
        # (shard_turns.py); the bootstep installs it on each connection's channel.
        self.turns: ShardTurns | None = None
        if self._driver == "redis" and settings.shards > 1:
            self.turns = ShardTurns(settings.shards, lambda: self.shard_window)
        self.max_hold = settings.max_hold_seconds or self._default_max_hold()
        self._lock = threading.RLock()
        # intake_running: an intake moves this worker's queues' fair messages; metrics_port:
        # where this worker serves its metrics (both given by attach).
        self.intake_running = False
        self.metrics_port: int | None = None
        self._last_spill = -float("inf")
        self._revoked_seen = (-1, -1, -1)
        self._sweep_entry: Any = None
        logger.info(
            "celery-fair gate ready: %d job type(s), max_held=%d, max_hold=%.0fs, state=%s, "
            "settings=%r",
            len(self.types),
            settings.max_held,
            self.max_hold,
            f"shared as {worker_id}" if engine.store is not None else "this worker alone",
            settings.describe(),
        )

    @classmethod
    def for_worker(
        cls,
        consumer: Any,
        settings: Any,
        types: Mapping[str, JobType],
        process_task: Callable[[Any], Any],
        store: Store | None = None,
        worker_id: str = "worker",
        observer: Observer | None = None,
    ) -> Gate:
        """The gate of a real worker's consumer: its scheduler on the wall clock, its engine
        over ``store`` (``None``: this worker decides alone), reporting to the gate's counters
        and ``observer``, and the real clocks."""
        wall = WallClock()
        lookahead, sizer = plan_reserve(settings, consumer.pool, shared=store is not None)
        scheduler = Scheduler(
            settings.scheduler_config(slots_of(consumer.pool, settings) + lookahead),
            wall,
            types.values(),
        )
        counters = Counters()
        fanout: Observer = counters if observer is None else Fanout(counters, observer)
        engine = Engine(
            scheduler,
            store,
            worker=worker_id,
            outage=settings.store_outage,
            poll_interval=settings.store_poll_interval,
            observer=fanout,
        )
        return cls(
            consumer,
            settings,
            types,
            process_task,
            scheduler=scheduler,
            engine=engine,
            counters=counters,
            observer=fanout,
            driver=consumer.app.connection_for_read().transport.driver_type,
            lookahead=lookahead,
            sizer=sizer,
            wall=wall,
            monotonic=MonotonicClock(),
            worker_id=worker_id,
        )

    def attach(
        self,
        consumer: Any,
        pool: Any,
        *,
        shard_windows: ShardWindows | None = None,
        intake_running: bool = False,
        metrics_port: int | None = None,
    ) -> None:
        """The consumer (re)started: the consumer and pool to act through, each shard
        consumer's window on this connection (RabbitMQ with shards, consumer_prefetch.py),
        whether an intake moves this worker's queues' fair messages into their shards, and
        the port this worker serves its metrics on. Called before ``on_connected``."""
        with self._lock:
            self.consumer = consumer
            self.pool = pool
            self.shard_windows = shard_windows
            self.intake_running = intake_running
            self.metrics_port = metrics_port

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
                received=self._wall.now(),
                horizon=self.settings.submitted_horizon_seconds,
                priorities=self._declared,
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
            for problem in parsed.problems:
                self.observer.repaired(problem.header)
            for problem in parsed.bounded:
                self.observer.repaired(problem.header)
                if self._bounds.due(problem.header, self._monotonic.now()):
                    logger.warning(
                        "Task %s[%s]: %s; %s (counted in fair-repaired; logged again after "
                        "%.0f s without another).",
                        req.name,
                        req.id,
                        problem,
                        BOUNDED_OUTCOME.get(problem.header, "repaired"),
                        self._bounds.quiet,
                    )
            self._hold(req, parsed)
            scheduler = self.scheduler
            if scheduler.running < scheduler.capacity or self._runner is not None:
                self.dispatch()
            else:  # every slot is busy: nothing can start before a job ends (which dispatches)
                self._adjust_qos()

    def _hold(self, req: Any, parsed: FairHeaders) -> None:
        uid = request_uid(req.id, req.request_dict)
        earlier = self.held.get(uid)
        if earlier is not None:
            # The broker redelivered a message we hold (an ack timeout ran out): keep one, the
            # newer delivery, at the place the first one had.
            self.observer.duplicate()
            logger.warning(
                "Task %s[%s] was delivered again while held; keeping one copy.", req.name, uid
            )
            ack_quietly(earlier.req)
            earlier.req = req
            return
        if uid in self.runs.fair:
            self.observer.duplicate()
            logger.warning(
                "Task %s[%s] was delivered again while running; dropping the copy.",
                req.name,
                uid,
            )
            ack_quietly(req)
            return
        arrival = parsed.submitted if parsed.submitted is not None else self._wall.now()
        priority = parsed.priority
        if self._priorities and req.id in self._priorities:
            priority = self._priorities.pop(req.id)  # given while it was on its way
            arrival = self._wall.now()  # and a new priority restarts its wait, as reprioritize does
        self.engine.submit(
            uid,
            parsed.job_type,
            parsed.job_id,
            parsed.fairness_key,
            arrival=arrival,
            priority=priority,
        )
        held = self.held[uid] = Held(req, self._monotonic.now(), parsed, arrival)
        held.priority = priority
        if uid != req.id:
            self._uids[req.id] = uid
        shards = self.settings.shards
        shard = None
        if self.turns is not None:
            held.shard = shard = shard_of(parsed.fairness_key, shards)
            self.turns.add(shard)
        if len(self.held) > self.held_peak:
            self.held_peak = len(self.held)
        if sends_events(req):
            if shard is None and shards > 1:
                shard = shard_of(parsed.fairness_key, shards)
            key_pending = self.scheduler.pending_of(parsed.fairness_key)
            held.events = {
                "fairness_key": parsed.fairness_key,
                "job_type": parsed.job_type,
                "job_id": parsed.job_id,
                "shard": shard,
                "place_in_key": key_pending,
                "held_at_receipt": len(self.held),
            }
            if parsed.submitted is not None:  # its publish, for the wait from then
                held.events["submitted"] = parsed.submitted
            attach(req, held.events)
        if self._reserve and not self._recheck:
            # Worth a store call only if the reserve would hold the newcomer up longer than
            # it is meant to hold anything: fair_reserve_seconds of the pool's work.
            tolerance = self.settings.reserve_seconds * self._pool_slots
            self._recheck = self.scheduler.outranks(uid, self._reserve.values(), tolerance)

    def _start_plain(self, req: Any) -> None:
        self._handoff(self.runs.add(req, None))

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
            capacity = self._fair_slots() + self.lookahead
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
        if mark and len(self._reserve) + self.runs.in_line > mark:
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
            if self._runner is None:
                return
            self._engine_loop.step()

    def _hand_to_link(self, call: Call) -> Any:
        assert self._runner is not None
        self._runner.submit(call)
        return LATER

    def on_reply(self, call: Call, result: Any) -> None:
        """A store call came back (on the loop): act on it, then decide again."""
        with self._lock:
            self._engine_loop.answered(call, result)
            self.dispatch()

    def _act_on(self, decision: Decision) -> None:
        if decision.start or decision.drop:
            self._act(decision)

    def _act(self, decision: Decision) -> None:
        for admission in decision.start:
            uid = str(admission.ref)
            held = self.held.get(uid)
            if held is None:  # forgotten while the store decided: let its slot go
                self.engine.finish(uid, None, unstarted=True)
                continue
            wait = self._monotonic.now() - held.received
            self.observer.admitted(admission.type, admission.priority, wait)
            effective = admission.effective_priority
            if effective is not None and (effective != admission.priority or admission.urgent):
                self.observer.promoted(
                    admission.type, effective - admission.priority, admission.urgent
                )
            if held.events is not None:
                held.events["queue_wait"] = round(wait, 6)
                submitted = held.events.get("submitted")
                if submitted is not None:  # on two clocks: the producer's and this one
                    held.events["publish_wait"] = round(max(0.0, self._wall.now() - submitted), 6)
                held.events["fencing_token"] = admission.token
                held.events["fair_priority"] = admission.priority  # its own, reprioritised too
                if effective is not None:
                    held.events["effective_priority"] = effective
                if admission.urgent:  # only then: Flower shows every field that is set
                    held.events["urgent"] = True
            if len(self.runs) < self._pool_slots:
                self._start(uid, admission)
            else:
                self._reserve[uid] = admission
        for ref in decision.drop:
            uid = str(ref)
            held = self._unhold(uid)
            if held is None:
                continue
            self.observer.duplicate()
            logger.warning(
                "Task %s[%s] already ran to the end on %s; dropping this copy.",
                held.req.name,
                uid,
                "this worker" if uid in self.finished_here else "another worker",
            )
            ack_quietly(held.req)
            worker_state.task_ready(held.req)
            if self.settings.tracking:
                # The store drops a copy only once its job finished for good, and that end
                # forgot the job's entry; an entry now is this copy's own (its task id was
                # published again), and nothing else will end it. A copy dropped while its job
                # still runs (``_hold``) leaves the entry alone: it stands for the running job.
                untrack(self.app, [held.req.id])

    def _start(self, uid: str, admission: Admission) -> None:
        """Hand an admitted job to the pool."""
        held = self._unhold(uid, starts=True)
        assert held is not None
        req = held.req
        run = self.runs.add(req, uid)
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
        self.observer.started(admission.type, admission.priority)
        self._handoff(run)

    def _hand_reserved(self) -> None:
        """Start reserved jobs on free pool processes, unless a newcomer may go first or
        their admission may be lost (``Engine.vet``)."""
        if self._recheck:
            if self.engine.busy:
                return  # asked again when the store answers (on_reply dispatches)
            self._recheck = False
            # Those given back are pending again: dispatch's next decision admits them and
            # the newcomer that ranks before them, in the new order.
            for uid in self.engine.reconsider(list(self._reserve)):
                del self._reserve[str(uid)]
        reserve = self._reserve
        if not reserve or len(self.runs) >= self._pool_slots:
            return
        # Only those whose admission surely still holds (a pause past the lease may have lost
        # it): the engine gives the others back, or keeps them waiting for the store.
        vetted = self.engine.vet(list(reserve))
        for uid in vetted.given_back:
            del reserve[str(uid)]
        for ref in vetted.ready:
            if len(self.runs) >= self._pool_slots:
                break
            uid = str(ref)
            self._start(uid, reserve.pop(uid))

    def _handoff(self, run: Run) -> None:
        """Hand a run to the worker's own path to the pool; notice if it never got there."""
        req = run.req
        try:
            self.process_task(req)
        except Exception:
            logger.exception("Task %s[%s] could not be handed to the pool.", req.name, req.id)
            self._finished(run, None)
            return
        if not run.applied and already_revoked(req):
            # revoked (or expired) at the pool's door: Celery acked it; it never ran
            self._finished(run, None, unstarted=True)

    @property
    def pool_slots(self) -> int:
        """The pool's size now (or ``fair_capacity`` if smaller)."""
        return self._pool_slots

    @property
    def adaptive(self) -> bool:
        """Whether the reserve's depth follows the jobs' wall times (``fair_lookahead`` unset,
        with a shared store)."""
        return self._sizer is not None

    def _fair_slots(self) -> int:
        """The pool's slots fair jobs may run in now: its size less its plain runs."""
        return max(0, self._pool_slots - self.runs.plain)

    def _slots(self) -> int:
        """The pool's size now (autoscale moves it), or ``fair_capacity`` if smaller."""
        return slots_of(self.pool, self.settings)

    # -- pool callbacks ------------------------------------------------------------------

    def wrap_callbacks(self, args: Any, options: dict[str, Any]) -> dict[str, Any]:
        """Wrap one ``apply_async`` call's callbacks to learn when its run starts and ends.

        ``args`` are the trace arguments Celery gives the pool: (type, task id, request, ...).
        """
        run = self.runs.taken(options)
        return options if run is None else wrap_callbacks(options, run, self._finish_soon)

    def _finish_soon(self, run: Run, timed: bool) -> None:
        elapsed = run.elapsed(self._monotonic.now()) if timed else None
        hub = self.consumer.hub
        if self._green and not self._closed:
            # Still on the job's own greenlet, which holds its pool slot until it returns:
            # starting the next job from here would wait for that very slot. A fresh greenlet
            # (the timer's) does it once this one has ended.
            self.consumer.timer.call_after(0, self._finished, (run, elapsed))
        elif hub is None or self._closed or threading.get_ident() == self._loop_thread:
            # On the loop already (prefork's results are read there): release the slot and
            # start the next job in the same breath, as Celery releases its own semaphore.
            self._finished(run, elapsed)
        else:  # a pool thread (the threads pool): the loop does it
            hub.call_soon(self._finished, run, elapsed)

    def _finished(self, run: Run, elapsed: float | None, *, unstarted: bool = False) -> None:
        """A run handed to the pool is done (any outcome): release its slot; learn if timed.
        ``unstarted``: it never ran (revoked or expired before the pool began it), so its
        key gets back what it was charged."""
        with self._lock:
            if not self.runs.release(run):
                return
            uid = run.uid
            if uid is not None:
                self._unalias(run.req.id, uid)
                # Acknowledged means the broker will not deliver it again: the store may then
                # recognise a late copy of its message.
                final = bool(getattr(run.req, "acknowledged", False))
                self.engine.finish(uid, elapsed, final=final, unstarted=unstarted)
                if final:
                    self.finished_here.add(uid)
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
            self.window.sweep(self._fair_inside())
            blocked_idle = self._blocked_idle()
        windows = self.shard_windows
        if windows is not None and threading.get_ident() == self._loop_thread:
            windows.follow(blocked_idle, narrow=self.shard_window)

    def _release_revoked_in_line(self) -> None:
        """Release runs that Celery revoked (or found expired) while they waited in line for a
        pool slot. O(runs)."""
        for run in self.runs.revoked_in_line():
            self._finished(run, None, unstarted=True)

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
        marker = revoked_marker()
        if marker == self._revoked_seen and not any(h.req.expires for h in self.held.values()):
            return
        self._revoked_seen = marker
        for uid, held in list(self.held.items()):
            # revoked() also handles expiry, and does Celery's bookkeeping: ack, events, state.
            if held.req.revoked():
                self._forget(uid)
                self.observer.revoked_held()
                logger.info(
                    "Held task %s[%s] was revoked or expired; dropped from the gate.",
                    held.req.name,
                    uid,
                )

    def _refresh_old_holds(self) -> None:
        deadline = self._monotonic.now() - self.max_hold
        for held in list(self.held.values()):
            if held.received > deadline:
                break  # held is ordered by receipt
            if self._republish(held, reason="held longer than the broker waits for an ack"):
                self.observer.refreshed()

    def _spill(self) -> None:
        now = self._monotonic.now()
        if now - self._last_spill < self.settings.spill_interval:
            return
        self._last_spill = now
        pending = [v for v in self.scheduler.snapshot().jobs if v.place is not None]
        # A paused job goes back to the broker only if nothing else can, and once per pause:
        # it carries the policies' version it was returned under, and is not returned again
        # while that version holds (it would only come back, round and round).
        version = self.engine.policy_version
        running = [v for v in pending if BlockReason.PAUSED not in v.blocked_by]
        if not running:
            running = [v for v in pending if self._paused_mark(v.ref) != version]
        victims = running[-max(1, len(running) // 10) :] if running else []
        spilled = 0
        for view in reversed(victims):
            held = self.held.get(view.ref)  # type: ignore[call-overload]
            paused = BlockReason.PAUSED in view.blocked_by
            extra = {PAUSED_SPILL: version} if paused else None
            if held is not None and self._republish(
                held, reason="held work blocks the queue", extra=extra
            ):
                spilled += 1
        self.observer.spilled(spilled)
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
        self._unhold(uid)
        if self._reserve.pop(uid, None) is not None:
            self.engine.finish(uid, None, unstarted=True)
        else:
            self.engine.cancel(uid)

    def _unhold(self, uid: str, *, starts: bool = False) -> Held | None:
        """Take ``uid`` out of ``held`` (and out of its shard's count); ``starts``: it goes to
        the pool, so it is still this worker's job. O(1)."""
        held = self.held.pop(uid, None)
        if held is not None:
            if held.shard >= 0 and self.turns is not None:
                self.turns.remove(held.shard)
            if not starts:
                self._unalias(held.req.id, uid)
        return held

    def _unalias(self, task_id: str, uid: str) -> None:
        if uid != task_id and self._uids.get(task_id) == uid:
            del self._uids[task_id]

    def _uid(self, task_id: str) -> str:
        """The uid of this worker's job named ``task_id``. O(1)."""
        return self._uids.get(task_id, task_id)

    def _adjust_qos(self) -> None:
        self.window.follow(len(self.held), self._fair_inside(), self._window_limit())

    def _window_limit(self) -> int:
        """How many messages the gate should hold (window.py). O(1).

        The bound is for shards on Redis, whose transport pops the queues in strict turns: a
        newcomer's shard comes at most one turn after the burst's. RabbitMQ shares a full
        window's freed places among the queues by lot, so a newcomer could lose several draws
        to the burst: there each shard's consumer has a window of its own instead
        (consumer_prefetch.py), and the channel's may reach ``fair_max_held``."""
        max_held: int = self.settings.max_held
        shards: int = self.settings.shards
        if shards <= 1 or self._driver != "redis" or self._blocked_idle():
            return max_held
        return min(max_held, self.scheduler.capacity + shards)

    @property
    def shard_window(self) -> int:
        """Each shard consumer's own window on RabbitMQ while nothing blocks: what the worker
        can start (its slots and reserve) plus one look (consumer_prefetch.py)."""
        return self.scheduler.capacity + 1

    def _blocked_idle(self) -> bool:
        """A pool process idles that no held job can take: they all wait for conflicts or
        caps (an empty place in the reserve is no reason: a cap may keep it empty while every
        process is busy). O(1)."""
        scheduler = self.scheduler
        return scheduler.starved and scheduler.running < scheduler.capacity - self.lookahead

    def _fair_inside(self) -> bool:
        return bool(self.held or self.runs.fair)

    def on_connected(self) -> None:
        """A new connection (and QoS): open the lookahead if fair work is running."""
        self._loop_thread = threading.get_ident()
        with self._lock:
            self.window.reset()
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
            self.window.reset()  # a new connection gets a new QoS
            self.shard_windows = None  # and new consumers

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

    def _paused_mark(self, uid: object) -> int | None:
        """The policies' version a held message was returned under while paused, if any."""
        held = self.held.get(uid)  # type: ignore[call-overload]
        return None if held is None else held.headers.paused_spill

    def _republish(self, held: Held, *, reason: str, extra: dict[str, Any] | None = None) -> bool:
        """Put a held message back on its queue (all headers kept, ``extra`` added), then ack
        it."""
        req = held.req
        try:
            return_to_queue(
                self.app, req, held.arrival, held.headers.republished, self._shard_key(held), extra
            )
        except Exception:
            logger.exception(
                "Could not return held task %s[%s] to the broker (%s); still holding it.",
                req.name,
                req.id,
                reason,
            )
            return False
        worker_state.task_ready(req)
        self._forget(request_uid(req.id, req.request_dict))
        logger.info("Returned held task %s[%s] to the broker: %s.", req.name, req.id, reason)
        return True

    def _shard_key(self, held: Held) -> str | None:
        """The key whose shard a returned message goes to: its own, while an intake moves
        what is published to its queue into the shards (else it goes back where it came)."""
        if not self.intake_running:
            return None
        return held.headers.fairness_key or None

    def _dead_letter(self, req: Any, why: str) -> None:
        queue = self.settings.dead_letter_queue
        try:
            dead_letter(self.app, req, why, queue)
        except Exception:
            logger.exception(
                "Could not dead-letter task %s[%s]; rejecting it instead.", req.name, req.id
            )
            req.reject(requeue=False)
            return
        self.observer.dead_lettered()
        req.acknowledge()
        worker_state.task_ready(req)
        req.send_event("task-rejected", requeue=False)
        if self.settings.tracking:  # its submission ended here
            untrack(self.app, [req.id])
        logger.error("Task %s[%s] sent to dead letter queue %r: %s", req.name, req.id, queue, why)

    # -- inspection ----------------------------------------------------------------------

    def job_status(self, uid: str) -> dict[str, Any] | None:
        """What this worker knows of fair job ``uid``: held (waiting, with its place and what
        holds it back, as values), reserved (admitted, waiting for a free process) or running;
        ``None`` if it is not here. O(held) for a held job (its place), O(1) otherwise."""
        with self._lock:
            uid = self._uid(uid)
            if uid in self.runs.fair:
                view = self.scheduler.status(uid)
                out: dict[str, Any] = {"state": "running"}
                if view is not None:
                    out["effective_priority"] = view.effective_priority
                return out
            held = self.held.get(uid)
            if held is None:
                return None
            waited = round(self._monotonic.now() - held.received, 3)
            if uid in self._reserve:
                return {"state": "reserved", "waited": waited}
            view = self.scheduler.status(uid)
            if view is None:
                return {"state": "held", "waited": waited}
            start = self.scheduler.expected_start(uid, self._pool_slots)
            found = self.scheduler.why(uid)
            waits_for = None if start is None else start.waits_for
            return {
                "state": "held",
                "waited": waited,
                "place": view.place,
                "place_in_key": view.place_in_key,
                "held": len(self.held),
                "fairness_key": view.fairness_key,
                "priority": view.priority,
                "effective_priority": view.effective_priority,
                "urgent": view.urgent,
                "blocked_by": [r.value for r in view.blocked_by],
                # what holds it back, as values ("blockers", "ahead": core.inspect.why_to_dict);
                # job control writes them in English (celery_fair.words)
                **({} if found is None else why_to_dict(found)),
                "expected_wait": None if start is None else start.seconds,
                # the share of that estimate built on default costs (nothing learned yet)
                "expected_wait_defaults": 0.0 if start is None else start.from_defaults,
                # what it waits for that the estimate does not measure (a BlockReason's value)
                "waits_for_reason": None if waits_for is None else waits_for.value,
                # the same in words, for job-control clients older than the values
                "why": words.lines(found),
                "waits_for": _waits_for(start, found),
                # the conflict it waits for, for job control to name its holder fleet-wide
                "conflict": conflict_field(
                    self._groups.get(held.headers.job_type) or "", held.headers.job_id
                )
                if BlockReason.CONFLICT in view.blocked_by
                else "",
            }

    def cancel(self, task_id: str) -> str | None:
        """Cancel job ``task_id`` if this worker has it. O(1).

        Call it once ``task_id`` is in Celery's revoked set (the ``fair_cancel`` command puts it
        there first). A held or reserved job is dropped at once the way Celery drops a revoked
        message (acked, marked revoked in the result backend, a ``task-revoked`` event) and its
        key gets back whatever its admission was charged: ``"cancelled"``. A job handed to the
        pool is ``"already_running"`` (one still waiting for a pool process is dropped at the
        pool's door, refunded, as Celery's revoke does). ``None``: not here.
        """
        answer = self._cancel(task_id)
        self.observer.controlled("cancel", answer or "elsewhere")
        return answer

    def _cancel(self, task_id: str) -> str | None:
        with self._lock:
            uid = self._uid(task_id)
            if uid in self.runs.fair:
                return "already_running"
            held = self.held.get(uid)
            if held is None:
                return None
            if not held.req.revoked():  # only if task_id was not put in the revoked set
                return None
            self._forget(uid)
            self.observer.revoked_held()
            logger.info(
                "Held task %s[%s] was cancelled; dropped from the gate.", held.req.name, uid
            )
            self.dispatch()  # a reserved job's slot may be free now
            return "cancelled"

    def reprioritize(self, task_id: str, priority: int | None) -> str | None:
        """Give job ``task_id`` the priority ``priority`` (``None``: its type's) if it has not
        started. O(log held).

        A held job moves at once (``Engine.reprioritize``: it is taken as arriving now) and
        may start at this very decision: ``"ok"``. A job admitted or running is
        ``"already_running"``. ``None``: not here; the priority is then remembered for it
        (the last ``REMEMBERED`` of them), so that it takes it if it arrives later: a job
        still in the broker, or redelivered here when the worker holding it dies.

        Raises:
            SchedulerError: ``priority`` is not ``None`` or a positive int.
        """
        check_priority(priority)
        answer = self._reprioritize(task_id, priority)
        self.observer.controlled("reprioritize", answer or "elsewhere")
        return answer

    def _reprioritize(self, task_id: str, priority: int | None) -> str | None:
        with self._lock:
            uid = self._uid(task_id)
            if uid in self.runs.fair or uid in self._reserve:
                return "already_running"
            held = self.held.get(uid)
            if held is None:
                remembered = self._priorities
                remembered.pop(task_id, None)
                remembered[task_id] = priority
                if len(remembered) > REMEMBERED:
                    del remembered[next(iter(remembered))]
                return None
            outcome = self.engine.reprioritize(uid, priority)
            if outcome is PriorityOutcome.RUNNING:
                return "already_running"
            if outcome is not PriorityOutcome.OK:
                return None
            held.priority = priority
            logger.info("Held task %s[%s] now has priority %s.", held.req.name, uid, priority)
            self.dispatch()  # it may go first now
            return "ok"

    def pool_info(self) -> dict[str, Any]:
        """Flat statistics for ``inspect stats`` (Flower shows them on the pool tab). O(held)."""
        with self._lock:
            oldest = next(iter(self.held.values()), None)
            blocked = self.scheduler.blocked_counts()
            tiers: dict[int, list[int]] = {}  # tier: [held, running]
            for h in self.held.values():
                p = (
                    h.priority
                    if h.priority is not None
                    else self.types[h.headers.job_type].priority
                )
                tiers.setdefault(p, [0, 0])[0] += 1
            for priority, running in self.scheduler.running_by_tier().items():
                tiers.setdefault(priority, [0, 0])[1] += running
            return {
                "fair-oldest-held-seconds": round(self._monotonic.now() - oldest.received, 3)
                if oldest is not None
                else 0.0,
                **{f"fair-blocked-{r.replace('_', '-')}": n for r, n in blocked.items()},
                "fair-held": len(self.held),
                "fair-policies-version": self.engine.policy_version,
                **{f"fair-held-tier-{p}": n[0] for p, n in sorted(tiers.items(), reverse=True)},
                **{f"fair-running-tier-{p}": n[1] for p, n in sorted(tiers.items(), reverse=True)},
                "fair-held-peak": self.held_peak,
                "fair-held-limit": self._window_limit(),
                **(
                    {"fair-shard-windows": self.shard_windows.prefetch.info()}
                    if self.shard_windows is not None
                    else {}
                ),
                "fair-key-allocation": dict(
                    top_allocations(
                        self.scheduler.allocation().slots, self.settings.metrics_top_keys
                    )
                ),
                # The pool's slots and the reserve apart: fair-running of fair-slots (the
                # pool's size less its plain runs) run in the pool; fair-reserved of
                # fair-lookahead wait admitted for a free process (the scheduler counts both).
                "fair-reserved": len(self._reserve),
                "fair-lookahead": self.lookahead,
                "fair-running": self.scheduler.running - len(self._reserve),
                "fair-slots": self._fair_slots(),
                "plain-running": self.runs.plain,
                "plain-started": self.runs.plain_started,
                "pool-in-line": self.runs.in_line,
                **self.counters.stats(),
                **({"fair-metrics-port": self.metrics_port} if self.metrics_port else {}),
                **{f"fair-store-{name}": v for name, v in self.engine.info().items()},
            }

    def look(self) -> GateLook:
        """What a metrics scrape reads (metrics.py). O(held + types); not on any hot path."""
        with self._lock:
            types = self.types
            held: dict[tuple[str, int], int] = {}
            oldest: dict[str, float] = {}  # fairness key: its oldest held job's publish time
            for h in self.held.values():
                name = h.headers.job_type
                tier = (name, types[name].priority)
                held[tier] = held.get(tier, 0) + 1
                key = h.headers.fairness_key
                if h.arrival < oldest.get(key, h.arrival + 1):
                    oldest[key] = h.arrival
            now = self._wall.now()
            return GateLook(
                held=held,
                running={(t, p): n for t, p, _, n in self.scheduler.by_type() if n},
                blocked=self.scheduler.blocked_counts(),
                reserved=len(self._reserve),
                plain_running=self.runs.plain,
                slots=self._fair_slots(),
                lookahead=self.lookahead,
                mode=self.engine.mode.value,
                heads={key: max(0.0, now - t) for key, t in oldest.items()},
                allocation=self.scheduler.allocation().slots,
            )

    def _default_max_hold(self) -> float:
        conf = self.app.conf
        driver = self._driver
        if driver == "redis":
            options = conf.broker_transport_options or {}
            timeout = float(options.get("visibility_timeout", REDIS_VISIBILITY_TIMEOUT))
        elif driver == "amqp":
            timeout = RABBITMQ_CONSUMER_TIMEOUT
        else:
            return float("inf")
        return timeout * HOLD_FRACTION


def _waits_for(start: Any, found: Why | None) -> str:
    """What ``start.waits_for`` is, in the words of its blocker in ``found``, or ``""``."""
    return words.waits_for(None if start is None else start.waits_for, found)


def slots_of(pool: Any, settings: Any) -> int:
    """The pool's size now (autoscale moves it), or ``fair_capacity`` if smaller."""
    size = pool_size(pool)
    capacity = settings.capacity
    return size if capacity is None else min(capacity, size) if size else capacity


def plan_reserve(settings: Any, pool: Any, *, shared: bool) -> tuple[int, ReserveDepth | None]:
    """The gate's lookahead, and what sizes it if it follows the jobs' wall times.

    Jobs admitted beyond the free slots wait in the gate's reserve until a pool process frees,
    which then starts one with no store round trip in between. By default, with a shared
    store, as many as cover ``fair_reserve_seconds`` of the pool's work (1 to RESERVE_MAX,
    following the jobs' measured wall times); none alone (the core decides at once there).
    Only for pools whose ends arrive on the event loop (prefork, threads).
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
