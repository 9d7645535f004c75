"""In-process foreground work: a block of the caller's own code, run as a fair job (issue 22).

::

    import celery_fair as fair

    with fair.slot("sync-clone", job_id="linux", fairness_key=request.remote_addr, timeout=30):
        clone_here("linux")         # runs in this process, once the fleet's scheduler admits it

    async with fair.slot("sync-clone", job_id="linux", fairness_key=ip, timeout=30):
        await clone_here("linux")   # the wait does not block the event loop

The block waits until the shared scheduler admits it against the same caps, conflicts and
fairness as the jobs that workers run, runs in the caller's process, and on exit (on an
exception too) releases its slot and teaches the fleet its cost (its elapsed time), charged to
its fairness key as a worker's job would be. A process that dies inside a slot leaves it to its
lease: the store releases the slot and its conflict when the lease expires
(``fair_lease_seconds``), as it does for a worker that dies.

How it works
------------
Each process has one ``SlotScheduler`` per app, made on first use (and again after a fork): an
``Engine`` (engine.py) with a core of its own of ``fair_slot_capacity`` slots and the app's job
types, on the same store as the workers (``open_store``), under a worker identity of its own.
A caller submits a job and waits on an event; one thread, the loop, makes the engine's store
calls (admissions, the heartbeats that keep the lease alive, releases) as the gate does, and
sets a caller's event when its job is admitted. Callers in one process are ordered by its core
(accumulated costs of their fairness keys, priorities, aging). Against the workers' held jobs
a waiting caller claims the next slot to free of a full tier or type (``Engine.foreground``),
as an urgent job does, so a worker's backlog cannot take every slot it frees again first.

Waking: every store call that releases running jobs, anywhere in the fleet, publishes on
``{prefix}:released`` (lua/common.lua). While callers wait, a listener thread subscribes and
wakes the loop, which asks the store at once. Schedulers that share a store in this process
(``MemoryStore``) wake each other instead. Either way the loop also looks every
``fair_store_poll_interval`` as a fallback. With no store at all (``fair_store_url =
"memory"``, or a broker that is not Redis and no store URL) the process decides alone: its own
capacity and caps, no fleet.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from . import words
from .core import Admission, JobType, Scheduler, SchedulerConfig, WallClock
from .engine import Call, Decision, Driver, Engine
from .errors import SlotTimeout, UnknownJobType
from .store.base import Store

__all__ = ["Slot", "SlotScheduler", "slot", "slot_scheduler"]

logger = logging.getLogger(__name__)

#: The least time between two looks at the store that a release woke (a busy fleet releases
#: thousands of jobs a second; a waiting process asks at most this often because of them).
WAKE_GAP = 0.01


class _Waiter:
    """One caller's job: submitted, then admitted (``admitted``), then ended (``gone``)."""

    __slots__ = ("admission", "admitted", "event", "gone", "job_id", "notify", "type", "uid")

    def __init__(
        self, uid: str, type: str, job_id: str | None, notify: Callable[[], None] | None
    ) -> None:
        self.uid = uid
        self.type = type
        self.job_id = job_id
        self.notify = notify  # called on the loop thread when admitted (an event loop's bridge)
        self.event = threading.Event()
        self.admitted = False
        self.gone = False  # withdrawn or finished: the engine no longer holds it
        self.admission: Admission | None = None


# Stores in this process that several schedulers share (MemoryStore, in tests and embedding):
# their calls are serialized by one lock per store, and a scheduler that released jobs wakes
# the others. A Redis store is each scheduler's own, and releases are announced by Redis.
_shared_lock = threading.Lock()
_store_locks: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_peers: weakref.WeakKeyDictionary[Any, weakref.WeakSet[SlotScheduler]] = weakref.WeakKeyDictionary()


def store_lock(store: Any) -> threading.Lock:
    """The lock that serializes calls to an in-process ``store`` shared by several schedulers
    (and by anything else in this process that calls it from another thread)."""
    with _shared_lock:
        lock = _store_locks.get(store)
        if lock is None:
            lock = _store_locks[store] = threading.Lock()
        return lock


class SlotScheduler:
    """One process's scheduler of in-process slots: an engine, its loop thread, and (on Redis)
    a listener for releases. Thread-safe; every method is O(1) engine work plus what the
    engine's own calls cost (engine.py).

    Args:
        types: The job types slots may name.
        config: The core's configuration; its capacity is how many slots run here at once.
        store: The fleet's store, or ``None`` to decide alone.
        worker: This process's identity in the store (unique per process start).
        outage, poll_interval: As for ``Engine``.
        resolve: Reads the job types again, for a type not known yet (tasks registered after
            the scheduler was made).
    """

    def __init__(
        self,
        types: Mapping[str, JobType],
        config: SchedulerConfig,
        store: Store | None = None,
        *,
        worker: str | None = None,
        outage: str = "hold",
        poll_interval: float = 0.5,
        resolve: Callable[[], Mapping[str, JobType]] | None = None,
    ) -> None:
        self.worker = worker or f"slots:{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:6]}"
        self.core = Scheduler(config, WallClock(), types.values())
        self.engine = Engine(
            self.core, store, worker=self.worker, outage=outage, poll_interval=poll_interval
        )
        self.engine.foreground = True  # a caller waits: claim a full cap's next free slot
        self.store = store
        self.pid = os.getpid()
        self._resolve = resolve
        self._lock = threading.Lock()  # guards the engine and the waiters
        self._wake = threading.Event()
        self._released = False  # a release was announced since the last turn
        self._waiters: dict[str, _Waiter] = {}  # submitted and not ended, by uid
        self._waiting = 0  # of them, not admitted yet
        self._closed = False
        self._last_woken = 0.0
        # The one engine loop (engine/driver.py): decide and apply under the lock, the store
        # call outside it, the admitted callers woken once the lock is let go.
        self._admitted: list[_Waiter] = []  # admitted under the lock, not yet woken
        self._driver = Driver(
            self.engine, self._act, execute=self._execute, lock=self._lock, settle=self._settle
        )
        lease = float(getattr(store, "lease", 30.0))
        # The fallback look, which also keeps the lease: never less often than thrice a lease.
        self.tick = min(poll_interval, lease / 3)
        channel = getattr(store, "released_channel", None)
        self._listening = threading.Event()  # set while callers wait: the listener subscribes
        # set while the listener is subscribed to the store's releases (for a look, and tests)
        self.subscribed = threading.Event()
        self._store_lock = store_lock(store) if store is not None and channel is None else None
        if self._store_lock is not None:
            with _shared_lock:
                _peers.setdefault(store, weakref.WeakSet()).add(self)
        self._thread = threading.Thread(target=self._loop, name="celery-fair-slots", daemon=True)
        self._thread.start()
        self._listener: threading.Thread | None = None
        if channel is not None:
            self._listener = threading.Thread(
                target=self._listen, args=(channel,), name="celery-fair-slots-wake", daemon=True
            )
            self._listener.start()

    @classmethod
    def for_app(cls, app: Any) -> SlotScheduler:
        """The scheduler of ``app``'s slots: its settings, its job types (``fair_types`` and its
        fair tasks), and the store its workers use."""
        from .connect import declared_types, open_store, settings_of

        settings = settings_of(app)
        types = declared_types(app, dict(settings.types))
        return cls(
            types,
            settings.scheduler_config(settings.slot_capacity),
            open_store(settings, app),
            outage=settings.store_outage,
            poll_interval=settings.store_poll_interval,
            resolve=lambda: declared_types(app, dict(settings.types)),
        )

    # -- callers ---------------------------------------------------------------------------

    def submit(
        self,
        type: str,
        job_id: str | None,
        fairness_key: str,
        *,
        cost: float | None = None,
        notify: Callable[[], None] | None = None,
    ) -> _Waiter:
        """A job for the scheduler; its ``event`` is set (and ``notify`` called, on the loop
        thread) when it is admitted.

        Raises:
            UnknownJobType: No fair task and no ``fair_types`` entry declares ``type``.
        """
        self._know(type)
        uid = f"slot:{uuid.uuid4().hex}"
        waiter = _Waiter(uid, type, job_id, notify)
        with self._lock:
            if self._closed:
                raise RuntimeError("celery-fair: this slot scheduler is closed")
            self.engine.submit(uid, type, job_id, fairness_key, arrival=time.time(), cost=cost)
            self._waiters[uid] = waiter
            self._waiting += 1
            self._listening.set()
        self._wake.set()
        return waiter

    def wait(self, waiter: _Waiter, timeout: float | None) -> tuple[bool, list[str]]:
        """Wait until ``waiter`` is admitted, at most ``timeout`` seconds: ``(True, [])``, or,
        withdrawn, ``(False, what held it back)``. Admitted at the last moment, it is kept."""
        if waiter.event.wait(timeout):
            return True, []
        return self.withdraw(waiter)

    def withdraw(self, waiter: _Waiter) -> tuple[bool, list[str]]:
        """Withdraw a job that has not been admitted: ``(False, what held it back)``; or, if it
        has been admitted meanwhile, ``(True, [])`` and it stays admitted."""
        with self._lock:
            if waiter.admitted:
                return True, []
            if waiter.gone:
                return False, []
            reasons = words.lines(self.core.why(waiter.uid))
            if not self.engine.cancel(waiter.uid):  # admitted in the core: give it back
                self.engine.finish(waiter.uid, None, unstarted=True)
            self._forget(waiter)
        self._wake.set()
        return False, reasons

    def give_back(self, waiter: _Waiter) -> None:
        """The caller will not run it (cancelled, or its event loop is gone): withdraw it, or,
        admitted, release it unstarted (its key gets its charge back)."""
        admitted, _ = self.withdraw(waiter)
        if admitted:
            self._end(waiter, None)

    def finish(self, waiter: _Waiter, elapsed: float) -> None:
        """The caller's block ran for ``elapsed`` seconds: release the slot and learn its cost."""
        self._end(waiter, elapsed)

    # -- lifecycle -------------------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads and report the ends not reported yet (best effort). Slots still
        open are released by the store when this process's lease expires."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        self._listening.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        with self._lock, self._calls():
            self.engine.flush()
        if self._store_lock is not None:
            with _shared_lock:
                _peers.get(self.store, weakref.WeakSet()).discard(self)
        elif self.store is not None:
            if self._listener is not None:
                self._listener.join(timeout)
            self.store.close()

    def released(self) -> None:
        """A job ended somewhere in the fleet: ask the store at once (if callers wait)."""
        self._released = True
        self._wake.set()

    @property
    def waiting(self) -> int:
        """Callers waiting for admission."""
        return self._waiting

    # -- internals -------------------------------------------------------------------------

    def _know(self, type: str) -> None:
        if type in self.core.types:
            return
        found = self._resolve() if self._resolve is not None else {}
        jtype = found.get(type)
        with self._lock:
            if jtype is not None and type not in self.core.types:
                self.core.register_type(jtype)
            known = sorted(self.core.types)
        if jtype is None:
            raise UnknownJobType(
                f"slot: no fair task and no fair_types entry declares job type {type!r} "
                f"(known: {', '.join(known) or 'none'})"
            )

    def _end(self, waiter: _Waiter, elapsed: float | None) -> None:
        with self._lock:
            if waiter.gone:
                return
            self.engine.finish(waiter.uid, elapsed, unstarted=elapsed is None)
            self._forget(waiter)
        self._wake.set()

    def _forget(self, waiter: _Waiter) -> None:
        """Under the lock: ``waiter`` leaves the scheduler."""
        waiter.gone = True
        del self._waiters[waiter.uid]
        if not waiter.admitted:
            self._waiting -= 1
        if not self._waiting:
            self._listening.clear()

    def _calls(self) -> Any:
        """The context in which this scheduler calls its store."""
        return self._store_lock if self._store_lock is not None else _NoLock()

    def _loop(self) -> None:
        while True:
            with self._lock:
                idle = not self._waiters and self.engine.idle
            # Idle, nothing is due: no beats, so the lease lapses and the fleet stops counting
            # this process as a worker until it asks again.
            self._wake.wait(None if idle else self.tick)
            self._wake.clear()
            if self._closed:
                return
            if self._released:
                gap = self._last_woken + WAKE_GAP - time.monotonic()
                if gap > 0:
                    time.sleep(gap)
                self._last_woken = time.monotonic()
            try:
                self._turn()
            except Exception:  # the loop must outlive any one failure
                logger.exception("celery-fair: the slot scheduler's loop failed; going on.")

    def _turn(self) -> None:
        """Decide and make the store calls until nothing is left to do now."""
        while not self._closed:
            with self._lock:
                if self._released:
                    self._released = False
                    self.engine.wake()
            call = self._driver.step()
            if call is None:
                return
            if call.reports_ends() and self._store_lock is not None:
                for peer in list(_peers.get(self.store, ())):
                    if peer is not self:
                        peer.released()

    def _act(self, decision: Decision) -> None:
        """The driver's act, under the lock: wake the admitted callers once it is let go."""
        self._admitted += self._admit(decision.start)

    def _settle(self) -> None:
        admitted, self._admitted = self._admitted, []
        self._notify(admitted)

    def _execute(self, call: Call) -> Any:
        try:
            with self._calls():
                return call.execute(self.store)  # type: ignore[arg-type]
        except Exception as exc:  # the engine handles every failure
            return exc

    def _admit(self, start: list[Admission]) -> list[_Waiter]:
        """Under the lock: the engine admitted ``start``."""
        out = []
        for admission in start:
            waiter = self._waiters.get(str(admission.uid))
            if waiter is None or waiter.gone:  # withdrawn meanwhile: give the slot back
                self.engine.finish(admission.uid, None, unstarted=True)
                self._wake.set()
                continue
            waiter.admitted = True
            waiter.admission = admission
            self._waiting -= 1
            if not self._waiting:
                self._listening.clear()
            out.append(waiter)
        return out

    def _notify(self, admitted: list[_Waiter]) -> None:
        for waiter in admitted:
            waiter.event.set()
            if waiter.notify is not None:
                try:
                    waiter.notify()
                except Exception:  # its event loop is closed: nobody will run it
                    self._end(waiter, None)

    def _listen(self, channel: str) -> None:
        """While callers wait, be subscribed to the store's releases and wake the loop."""
        client = self.store.client  # type: ignore[union-attr]
        pubsub: Any = None
        while not self._closed:
            if not self._listening.is_set():
                if pubsub is not None:
                    self.subscribed.clear()
                    _close_quietly(pubsub)
                    pubsub = None
                self._listening.wait()
                continue
            try:
                if pubsub is None:
                    pubsub = client.pubsub()
                    pubsub.subscribe(channel)
                message = pubsub.get_message(timeout=self.tick)
                if message is None:
                    continue
                if message["type"] == "subscribe":  # confirmed: no release is missed now
                    self.subscribed.set()
                self.released()  # a release, or what ended before the subscription: look
            except Exception as exc:  # the fallback look goes on; subscribe again later
                logger.debug("celery-fair: slot release listener: %s", exc)
                self.subscribed.clear()
                if pubsub is not None:
                    _close_quietly(pubsub)
                    pubsub = None
                self._wake.wait(self.tick)
        if pubsub is not None:
            _close_quietly(pubsub)


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _close_quietly(pubsub: Any) -> None:
    with contextlib.suppress(Exception):  # closing a broken connection
        pubsub.close()


_schedulers: weakref.WeakKeyDictionary[Any, SlotScheduler] = weakref.WeakKeyDictionary()
_schedulers_lock = threading.Lock()


def slot_scheduler(app: Any = None) -> SlotScheduler:
    """``app``'s slot scheduler in this process (the current app by default), made on first
    use, and made again in a child process after a fork (threads do not survive one)."""
    if app is None:
        from celery import current_app

        app = current_app._get_current_object()
    with _schedulers_lock:
        known = _schedulers.get(app)
        if known is None or known.pid != os.getpid():
            known = _schedulers[app] = SlotScheduler.for_app(app)
        return known


@atexit.register
def _close_all() -> None:
    """At exit, report the ends of slots not reported yet instead of leaving them to the lease."""
    for scheduler in list(_schedulers.values()):
        if scheduler.pid == os.getpid():
            with contextlib.suppress(Exception):  # best effort at exit
                scheduler.close(timeout=1.0)


class Slot:
    """One block of in-process work (see ``slot``): a context manager, sync or async, used once.

    After entering: ``waited`` (seconds until admitted) and ``admission`` (its token and
    estimate); after leaving: ``elapsed`` (seconds it ran, the cost the fleet learns).
    """

    def __init__(
        self,
        type: Any,
        job_id: str | None = None,
        fairness_key: str = "",
        *,
        timeout: float | None = None,
        cost: float | None = None,
        app: Any = None,
        scheduler: SlotScheduler | None = None,
    ) -> None:
        if not isinstance(type, str):  # a fair task (or its class): its job type
            type = type.job_type_name()
        self.type: str = type
        self.job_id = job_id
        self.fairness_key = fairness_key
        self.timeout = timeout
        self.cost = cost
        self._app = app
        self._scheduler = scheduler
        self._waiter: _Waiter | None = None
        self._began = 0.0
        self.waited: float | None = None
        self.elapsed: float | None = None
        self.admission: Admission | None = None

    def _submit(self, notify: Callable[[], None] | None = None) -> tuple[SlotScheduler, _Waiter]:
        if self._waiter is not None:
            raise RuntimeError("a fair slot is entered once; make a new one with slot(...)")
        scheduler = self._scheduler or slot_scheduler(self._app)
        self._scheduler = scheduler
        waiter = scheduler.submit(
            self.type, self.job_id, self.fairness_key, cost=self.cost, notify=notify
        )
        self._waiter = waiter
        return scheduler, waiter

    def _entered(self, asked: float) -> None:
        assert self._waiter is not None
        self._began = time.monotonic()
        self.waited = self._began - asked
        self.admission = self._waiter.admission

    def _timed_out(self, reasons: list[str]) -> SlotTimeout:
        return SlotTimeout(self.type, self.job_id, self.timeout or 0.0, reasons)

    def _leave(self) -> None:
        assert self._scheduler is not None
        assert self._waiter is not None
        self.elapsed = time.monotonic() - self._began
        self._scheduler.finish(self._waiter, self.elapsed)

    def __enter__(self) -> Slot:
        asked = time.monotonic()
        scheduler, waiter = self._submit()
        try:
            admitted, reasons = scheduler.wait(waiter, self.timeout)
        except BaseException:  # interrupted while waiting: nothing will run
            scheduler.give_back(waiter)
            raise
        if not admitted:
            raise self._timed_out(reasons)
        self._entered(asked)
        return self

    def __exit__(self, *exc: object) -> None:
        self._leave()

    async def __aenter__(self) -> Slot:
        asked = time.monotonic()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()

        def admitted() -> None:  # on the scheduler's thread
            loop.call_soon_threadsafe(_resolve, future)

        scheduler, waiter = self._submit(admitted)
        try:
            done, _ = await asyncio.wait({future}, timeout=self.timeout)
        except BaseException:  # cancelled while waiting
            scheduler.give_back(waiter)
            raise
        if not done:
            got, reasons = scheduler.withdraw(waiter)
            if not got:
                raise self._timed_out(reasons)
        self._entered(asked)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._leave()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def slot(
    type: Any,
    job_id: str | None = None,
    fairness_key: str = "",
    *,
    timeout: float | None = None,
    cost: float | None = None,
    app: Any = None,
) -> Slot:
    """Run a block of this process's own code as a fair job: ``with slot(...)`` or
    ``async with slot(...)`` waits until the fleet's scheduler admits it (same caps, conflicts
    on ``(conflict_group, job_id)``, fairness by ``fairness_key`` as the workers' jobs), runs
    the block, and on exit (on an exception too) releases the slot and learns its cost.

    Args:
        type: A job type's name, or a fair task (its type), declared by a fair task or in
            ``fair_types``.
        job_id: The resource it works on, for conflicts and learned costs.
        fairness_key: Who it is for (a client, a tenant).
        timeout: Seconds to wait for admission; then ``SlotTimeout`` (nothing ran). ``None``:
            wait as long as it takes.
        cost: Its cost when known in advance; otherwise the fleet's learned estimate.
        app: The Celery app (the current one by default).

    Raises:
        SlotTimeout: Not admitted within ``timeout``.
        UnknownJobType: ``type`` is not declared.

    Example:
        >>> with slot("sync-clone", job_id="linux", fairness_key=ip, timeout=30):
        ...     clone_here("linux")  # doctest: +SKIP
    """
    return Slot(type, job_id, fairness_key, timeout=timeout, cost=cost, app=app)
