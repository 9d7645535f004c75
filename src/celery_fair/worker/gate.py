"""The gate: holds fair requests unacknowledged and starts them in fair order.

Every request the consumer would hand to the pool comes here first (normal, ETA-fired and
rate-limit-released alike; see bootstep.py). A plain task goes straight on but counts against
the slots. A fair job is *held*: submitted to the scheduling core and kept, unacknowledged,
until the core admits it; then it goes to the worker's own ``process_task``, exactly as Celery
would have sent it, so acks (early or late), time limits, events and revokes stay Celery's.

It is a coordinator over parts that each hold one concern, take no lock and read no clock of
their own (docs/design.md section 7b lists them). It is given its scheduler, engine (and
through it the store) and clocks (``bootstep.gate_for_worker`` builds them for a real worker),
so a unit test drives it with a simulated clock and the memory store (tests/unit/test_gate.py).

Threading: with an event loop (Redis, RabbitMQ) everything runs on the loop thread and pool
callbacks from other threads are marshalled onto it with ``hub.call_soon``; without one
(the in-memory transport, gevent, eventlet) the gate acts where it is called, under its lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from celery.utils.log import get_logger

from ..connect import untrack
from ..core import Admission, JobType, ReserveDepth, Scheduler
from ..core.clock import Clock
from ..core.tenants import tenant_name
from ..engine import Call, Decision, Engine
from ..metrics import GateLook
from ..observe import Counters, Observer
from ..protocol import ControlAnswer
from ..routing import Lanes, Shards, shard_of
from . import events, views
from .consumer_prefetch import ShardWindows
from .copies import Copies, FinishedHere
from .headers import TOKEN, FairHeaders, request_uid
from .held import HeldJobs
from .housekeeping import Housekeeping, default_max_hold
from .internals import sends_events, writes_pending
from .job_control import JobControl
from .lanes_here import LanesHere
from .pacing import StorePacing
from .reading import HeaderReader
from .reserve import Reserve, slots_of
from .returns import Returns
from .runs import Handoff, Run, Runs
from .wake import Wake
from .window import Windows

__all__ = ["Gate"]

logger = get_logger(__name__)


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
    ) -> None:
        """``scheduler`` has ``lookahead`` places beyond the pool's slots; ``engine`` decides
        over it and ``engine.store``; ``counters`` are what ``inspect stats`` shows, among
        ``observer``'s listeners; ``driver``: the broker transport's. ``wall`` reads epoch
        seconds, as producers stamp ``fair_submitted``; ``monotonic`` the intervals and
        deadlines, on the base of the pool's accept times."""
        self.consumer = consumer
        self.app = consumer.app
        self.pool = consumer.pool
        self.settings = settings
        self.types = dict(types)
        self.process_task = process_task
        self.scheduler = scheduler
        self.engine = engine
        self.counters = counters
        self.observer = observer
        self.head_waits = events.HeadWaits()  # each key's last start here (seed 004)
        self._allocation: dict[str, int] = {}  # each key's slots as the last sweep saw them
        self._wall = wall
        self._monotonic = monotonic
        self._reader = HeaderReader(settings, self.types, observer)
        self.windows = Windows(
            lambda: self.consumer.qos,
            lambda: self.scheduler.capacity,
            max_held=settings.max_held,
            shards=settings.shards,
            driver=driver,
            lanes=Shards.of(self.app).consumed_lanes,
        )
        # lanes: where a held message counts, and the lanes this worker asks for (rule 3),
        # with lanes consumed; the fleet's map comes from its lane watch, once a second.
        consumed = Shards.of(self.app).consumed_lanes
        self.lanes: LanesHere | None = None
        if consumed > 0:
            window = lambda: self.windows.shard_window  # noqa: E731
            self.lanes = LanesHere(
                Lanes.of(self.app), settings.shards, consumed, window, monotonic.now
            )
        crowding = self.lanes.crowding if self.lanes is not None else None
        if self.lanes is not None and self.windows.turns is not None:
            # Redis reads the lanes it holds none of by how far behind their keys are (with
            # two-level keys, their tenants), those out of their rate last.
            here = self.lanes
            cost = scheduler.read_cost
            if settings.key_separator is None:
                self.windows.turns.behind = lambda slot: here.behind(slot, cost)
            else:
                self.windows.turns.behind = lambda slot: here.behind_tenants(slot, cost)
                self.windows.turns.behind_first = True
        self.held = HeldJobs(self.windows.turns, crowding)
        self.reserve = Reserve(lookahead, sizer)
        self.runs = Runs(monotonic.now)
        untrack_ids = (lambda ids: untrack(self.app, ids)) if settings.tracking else None
        # finished_here: the fair jobs this worker ended for good lately, to say where a late
        # copy's job ran when the store drops the copy.
        finished_here = FinishedHere(settings.dedupe_seconds, clock=monotonic.now)
        self.copies = Copies(observer, finished_here, untrack_ids)
        self.returns = Returns(
            self.app,
            observer,
            dead_letter_queue=settings.dead_letter_queue,
            forget=self._forget,
            untrack=untrack_ids,
        )
        self._lock = threading.RLock()
        transport_options = getattr(self.app.conf, "broker_transport_options", None)
        self.housekeeping = Housekeeping(
            self.held,
            scheduler,
            engine,
            observer,
            max_hold=settings.max_hold_seconds or default_max_hold(driver, transport_options),
            max_held=settings.max_held,
            spill_interval=settings.spill_interval,
            give_back=self.returns.give_back,
            forget=self._forget,
        )
        self.control = JobControl(
            self.held,
            self.reserve,
            self.runs,
            engine,
            observer,
            forget=self._forget,
            dispatch=self.dispatch,
        )
        self._hub: Any = None  # the event loop, with one (start_link)
        self._widening = False  # a change of the shard consumers' windows is on its way
        self._reroute: Callable[[str], bool] | None = None  # (attach)
        # A decision booked for when a key refills its rate or a held job ages (wake.py).
        self.wake = Wake(self.dispatch)
        # With an event loop (start_link): one store call per turn, sent by the store link.
        self.pacing = StorePacing(
            engine,
            self._act_on,
            lock=self._lock,
            line=lambda: len(self.reserve) + self.runs.in_line,
            refill_mark=self.reserve.refill_mark,
            writes_pending=lambda: writes_pending(self.pool),
        )
        self._parts = views.Parts(
            self.held,
            self.reserve,
            self.runs,
            scheduler,
            engine,
            counters,
            self.windows,
            self.types,
            self._reader.groups,
            settings.metrics_top_keys,
            self.lanes,
        )
        self.handoff = Handoff(
            self.runs,
            process_task,
            self._finished,
            monotonic.now,
            consumer=consumer,
            green=bool(getattr(self.pool, "is_green", False)),  # gevent, eventlet
        )
        # _pool_slots: the pool's size (autoscale moves it), read again by every sweep.
        self._pool_slots = slots_of(self.pool, settings)
        self.metrics_port: int | None = None  # where this worker serves metrics (attach)

    def attach(
        self,
        consumer: Any,
        pool: Any,
        *,
        shard_windows: ShardWindows | None = None,
        intake_running: bool = False,
        reroute: Callable[[str], bool] | None = None,
        metrics_port: int | None = None,
    ) -> None:
        """The consumer (re)started: the consumer and pool to act through, each shard
        consumer's window on this connection (RabbitMQ with shards, consumer_prefetch.py),
        whether an intake moves this worker's queues' fair messages into their shards, how
        it moves the stragglers out of a shard (``IntakeThread.reroute_soon``, Redis), and
        the port this worker serves its metrics on. Called before ``on_connected``."""
        with self._lock:
            self.consumer = self.handoff.consumer = consumer
            self.pool = pool
            self.windows.shards = shard_windows
            self.returns.intake_running = intake_running
            self._reroute = reroute
            self.returns.relane = reroute is not None
            self.metrics_port = metrics_port
            self.wake.cancel()
            self.wake.timer = getattr(consumer, "timer", None)

    # -- what the bootstep and the tools read ---------------------------------------------

    @property
    def pool_slots(self) -> int:
        """The pool's size now (or ``fair_capacity`` if smaller)."""
        return self._pool_slots

    @property
    def lookahead(self) -> int:
        """How many jobs may be admitted beyond the pool's free processes now."""
        return self.reserve.lookahead

    @property
    def max_hold(self) -> float:
        """Seconds a message may be held before it is returned to the broker."""
        return self.housekeeping.max_hold

    # -- requests in -------------------------------------------------------------------

    def on_request(self, req: Any) -> None:
        """Take a request the consumer would start now (installed as ``on_task_request``)."""
        with self._lock:
            parsed = self._reader.read(req, self._wall.now(), self._monotonic.now())
            if parsed is None:
                self.handoff.hand(self.runs.add(req, None))
                return
            if parsed.rejected:
                self.returns.dead_letter(req, "; ".join(map(str, parsed.problems)))
                return
            self._hold(req, parsed)
            scheduler = self.scheduler
            if scheduler.running < scheduler.capacity or self.pacing.linked:
                self.dispatch()
            else:  # every slot is busy: nothing can start before a job ends (which dispatches)
                self._adjust_qos()

    def _hold(self, req: Any, parsed: FairHeaders) -> None:
        uid = request_uid(req.id, req.request_dict)
        earlier = self.held.get(uid)
        if earlier is not None:
            self.copies.while_held(earlier, req, uid)
            return
        if uid in self.runs.fair:
            self.copies.while_running(req, uid)
            return
        held = self.held.receive(req, parsed, self._monotonic.now(), self._wall.now())
        key = parsed.fairness_key
        self.engine.submit(
            uid, parsed.job_type, parsed.job_id, key, arrival=held.arrival, priority=held.priority
        )
        shards = self.settings.shards
        with_events = sends_events(req)
        slot: int | None = None  # the queue it came from, for the turns and the lanes
        if self.lanes is not None:
            slot = self.lanes.slot(req, key)
        elif self.windows.turns is not None:
            slot = shard_of(key, shards)
        self.held.add(uid, held, slot)
        # stragglers held (lanes_here.py): read past them
        if self.lanes is not None and slot is not None:
            if self.lanes.held(self.held, slot, key):
                if self.windows.shards is not None:
                    self._widen_soon()
                elif self._reroute is not None:
                    self._reroute(self.lanes.shard_queue(req, key))
            elif self.windows.shards is not None and self.lanes.lane_opened(slot):
                self._widen_soon()  # their key's lane has messages: read past them now
        if with_events:
            shard = shard_of(key, shards) if shards > 1 else None
            place = self.scheduler.pending_of(key)
            separator = self.settings.key_separator
            tenant = None if separator is None else tenant_name(key, separator)
            held.events = events.on_receipt(parsed, shard, place, len(self.held), tenant)
            events.attach(req, held.events)
        # Worth a store call only if the reserve would hold the newcomer up longer than it is
        # meant to hold anything: fair_reserve_seconds of the pool's work.
        self.reserve.newcomer(self.scheduler, uid, self.settings.reserve_seconds * self._pool_slots)

    # -- decisions -----------------------------------------------------------------------

    def dispatch(self) -> None:
        """Start every held job that may start now. O(admitted), independent of held jobs.

        Alone, the core decides here and now. With a shared store on an event loop, this only
        notes that something changed: the loop's next turn makes one store call for all that
        changed during this turn (``_tick``), and the jobs start when its answer comes back.
        """
        with self._lock:
            if self.reserve:
                self._hand_reserved()
            capacity = self.runs.fair_slots(self._pool_slots) + self.reserve.lookahead
            if capacity != self.scheduler.capacity:
                self.scheduler.set_capacity(capacity)
            if self.pacing.linked:
                self.pacing.note()
            else:
                self._act_on(self.engine.run_inline())
            self._adjust_qos()
            self.wake.book(self.scheduler.next_rise(), self.scheduler.now())

    def on_reply(self, call: Call, result: Any) -> None:
        """A store call came back (on the loop): act on it, then decide again."""
        with self._lock:
            self.pacing.answered(call, result)
            self.dispatch()

    def _act_on(self, decision: Decision) -> None:
        for admission in decision.start:
            self._admitted(str(admission.uid), admission)
        for uid in decision.drop:  # the store says it already ran to the end: a copy
            held = self.held.take(str(uid))
            if held is not None:
                self.copies.already_ran(held, str(uid))

    def _admitted(self, uid: str, admission: Admission) -> None:
        """The engine admitted held job ``uid``: start it, or reserve it if no process is
        free."""
        held = self.held.get(uid)
        if held is None:  # forgotten while the store decided: let its slot go
            self.engine.finish(uid, None, unstarted=True)
            return
        wait = self._monotonic.now() - held.received
        events.report_admission(self.observer, held.events, admission, wait, self._wall.now())
        if len(self.runs) < self._pool_slots:
            self._start(uid, admission)
        else:
            self.reserve.add(uid, admission)

    def _start(self, uid: str, admission: Admission) -> None:
        """Hand an admitted job to the pool."""
        held = self.held.take(uid, starts=True)
        assert held is not None
        key = admission.fairness_key
        self.observer.head_waited(
            key, self.head_waits.started(key, admission.arrival, self._wall.now())
        )
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
        self.handoff.hand(run)

    def _hand_reserved(self) -> None:
        """Start reserved jobs on free pool processes, unless a newcomer may go first or
        their admission may be lost (``Reserve.startable``)."""
        reserve = self.reserve
        for uid in reserve.startable(self.engine, len(self.runs) < self._pool_slots):
            if len(self.runs) >= self._pool_slots:
                break
            admission = reserve.pop(uid)
            if admission is not None:
                self._start(uid, admission)

    # -- pool callbacks ------------------------------------------------------------------

    def wrap_callbacks(self, args: Any, options: dict[str, Any]) -> dict[str, Any]:
        """Wrap one ``apply_async`` call's callbacks to learn when its run starts and ends
        (``Handoff.wrap_callbacks``). ``args``: the trace arguments Celery gives the pool."""
        return self.handoff.wrap_callbacks(options)

    def _finished(self, run: Run, elapsed: float | None, unstarted: bool = False) -> None:
        """A run handed to the pool is done (any outcome): release its slot; learn if timed.
        ``unstarted``: it never ran (revoked or expired before the pool began it), so its
        key gets back what it was charged."""
        with self._lock:
            if not self.runs.release(run):
                return
            uid = run.uid
            if uid is not None:
                self.held.unalias(run.req.id, uid)
                # Acknowledged means the broker will not deliver it again: the store may then
                # recognise a late copy of its message.
                final = bool(getattr(run.req, "acknowledged", False))
                self.engine.finish(uid, elapsed, final=final, unstarted=unstarted)
                if final:
                    self.copies.finished_here.add(uid)
                if elapsed is not None:
                    # The dispatch below applies the reserve's new depth to the core's capacity.
                    self.reserve.observe(elapsed, self._pool_slots)
            if self.handoff.closed:
                self.engine.flush()
            else:
                self.dispatch()

    # -- housekeeping --------------------------------------------------------------------

    def sweep(self) -> None:
        """Periodic: drop revoked and expired holds, refresh old holds, follow the pool size,
        and spill if held work blocks the queue (housekeeping.py)."""
        with self._lock:
            house = self.housekeeping
            # As the last decision left things:
            deciding = self._deciding()
            blocking = house.blocking(deciding=deciding)
            self.windows.opening.observe(views.idle_blocked(self._parts, deciding=deciding))
            self._adjust_qos()  # on Redis, the opening moves the limit
            self._pool_slots = slots_of(self.pool, self.settings)
            house.drop_revoked()
            for run in self.runs.revoked_in_line():  # revoked while waiting for a pool slot
                self._finished(run, None, unstarted=True)
            house.refresh(self._monotonic.now())
            self.dispatch()
            if blocking:
                house.spill(self._monotonic.now())
            self.windows.prefetch.sweep(self._fair_inside())
            self._watch_allocation()
        if threading.get_ident() == self.handoff.loop_thread:
            self._follow_shard_windows()

    def _watch_allocation(self) -> None:
        """Tell the observer of each key whose allocation changed since the last sweep.
        O(k log k), once per sweep, never per decision."""
        now = self.scheduler.allocation().slots
        before = self._allocation
        for key in before.keys() | now.keys():
            was, got = before.get(key, 0), now.get(key, 0)
            if was != got:
                self.observer.allocation_changed(key, was, got)
        self._allocation = now

    def _deciding(self) -> bool:
        """A decision is due or the store is deciding: what the core last found may be out of
        date. O(1)."""
        return self.pacing.due or self.engine.busy

    def _forget(self, uid: str) -> None:
        self._drop_held(uid)
        self._adjust_qos()

    def _drop_held(self, uid: str) -> None:
        """Stop holding ``uid``: withdraw it, or give its admission back if it was reserved."""
        self.held.take(uid)
        if self.reserve.pop(uid) is not None:
            self.engine.finish(uid, None, unstarted=True)
        else:
            self.engine.cancel(uid)

    def _adjust_qos(self) -> None:
        self.windows.follow(len(self.held), self._fair_inside())

    def _fair_inside(self) -> bool:
        return bool(self.held or self.runs.fair)

    # -- the connection ------------------------------------------------------------------

    def on_connected(self) -> None:
        """A new connection (and QoS): open the lookahead if fair work is running."""
        self.handoff.loop_thread = threading.get_ident()
        with self._lock:
            self.windows.reset()
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
            self.windows.reset()  # a new connection gets a new QoS
            self.windows.shards = None  # and new consumers

    def start_link(self, hub: Any) -> None:
        """With an event loop, make store calls on it without blocking it (pacing.py)."""
        self._hub = hub
        self.pacing.start(hub, self.on_reply)

    def _widen_soon(self) -> None:
        """A straggler is held from a shard whose consumer has a window of its own (RabbitMQ),
        or a first message from its key's lane: widen it on the loop's next turn, outside the
        lock, if its stragglers are to be read past (``LanesHere.read_past``,
        consumer_prefetch.py)."""
        if not self._widening and self._hub is not None:
            self._widening = True
            self._hub.call_soon(self._follow_shard_windows)

    def _follow_shard_windows(self) -> None:
        """Each shard consumer's window as the blocked slots, ETA tasks and held stragglers
        to read past call for now (``ShardWindows.follow``). On the loop's thread, outside the
        lock."""
        self._widening = False
        shards = self.windows.shards
        if shards is None:
            return
        with self._lock:
            stragglers = self.lanes.read_past() if self.lanes is not None else None
        shards.follow(
            self.windows.opening.extra,
            self.windows.shard_window,
            stragglers,
            self._monotonic.now(),
        )

    def close(self) -> None:
        """The worker is shutting down: report what finished; later finishes are reported inline.

        A store call still in flight is abandoned; if it admitted jobs, they are released
        when this worker's lease expires.
        """
        with self._lock:
            self.handoff.closed = True
            self.wake.cancel()
            self.pacing.close()
            for uid in list(self.reserve):  # never started: their messages come back
                self._drop_held(uid)
            self.engine.flush()

    # -- job control and views -----------------------------------------------------------

    def cancel(self, task_id: str) -> ControlAnswer | None:
        """Cancel job ``task_id`` if this worker has it (``JobControl.cancel``). O(1)."""
        with self._lock:
            return self.control.cancel(task_id)

    def reprioritize(self, task_id: str, priority: int | None) -> ControlAnswer | None:
        """Give job ``task_id`` the priority ``priority`` if it has not started
        (``JobControl.reprioritize``). O(log held)."""
        with self._lock:
            return self.control.reprioritize(task_id, priority)

    def job_status(self, uid: str) -> dict[str, Any] | None:
        """What this worker knows of fair job ``uid`` (views.py ``job_status``)."""
        with self._lock:
            return views.job_status(self._parts, uid, self._monotonic.now(), self._pool_slots)

    def jobs(self, **filters: Any) -> tuple[list[dict[str, Any]], int]:
        """The fair jobs here, filtered (views.py ``jobs``). O(held + running)."""
        with self._lock:
            return views.jobs(self._parts, self._monotonic.now(), **filters)

    def pool_info(self) -> dict[str, Any]:
        """Flat statistics for ``inspect stats`` (views.py ``pool_info``). O(held)."""
        with self._lock:
            return views.pool_info(
                self._parts, self._monotonic.now(), self._pool_slots, self.metrics_port
            )

    def look(self) -> GateLook:
        """What a metrics scrape reads (views.py ``look``). O(held + types)."""
        with self._lock:
            return views.look(self._parts, self._wall.now(), self._pool_slots)
