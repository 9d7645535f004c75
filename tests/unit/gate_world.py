"""A worker's gate alone, for the unit tier: a real ``Gate`` over a real ``Scheduler``,
``Engine`` and ``MemoryStore``, on one simulated clock, with no broker and no worker.

What a broker and Celery's worker would do around the gate is played by the smallest stand-ins
that do it honestly:

- ``Req`` stands in for Celery's ``Request``: the gate reads its ``id``, ``name``,
  ``request_dict`` (the message headers), ``expires``, ``revoked()``, ``acknowledge()``,
  ``reject()``, ``send_event()`` and its Kombu message (``_message``: ``ack``, ``headers``,
  ``delivery_info``). Its ``revoked()`` does what Celery's does for an id in the worker's
  revoked set (``celery_revoke`` puts it there, as Celery's ``revoke`` command does) or one
  marked revoked: acknowledge, report it, and say so again at every later ask. Its success
  callback acknowledges as Celery does after a run.
- ``Pool`` stands in for the fair pool: ``process_task`` is Celery's path to it, and it records
  each request handed over with the callbacks the gate wrapped (as ``FairPool.apply_async``
  does); ``finish`` ends a run the way the pool's result callback does. ``num_processes`` is
  its size, which autoscale moves; it counts the most runs it had at once (``peak``).
- ``App`` stands in for the Celery app where the gate returns a message to the broker: its
  producer records what is published (``published``), which ``World.redeliver`` hands back
  as the broker would deliver it.

The broker adds nothing to the rules these stand-ins drive (hold, admission order, conflicts,
caps, the reserve, job control, spills, the ack-timeout refresh): the real-worker tests in
tests/integration and tests/e2e keep what brokers do (acks, redelivery, shards, windows, killed
processes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery.utils.collections import LimitedSet
from celery.worker import state as worker_state

from celery_fair.core import JobType, ReserveDepth, Scheduler, SimClock
from celery_fair.engine import Engine
from celery_fair.observe import Counters
from celery_fair.settings import FairSettings
from celery_fair.store.memory import MemoryStore
from celery_fair.worker.gate import Gate

EPOCH = 1_700_000_000.0  # the simulated wall clock starts at a plausible epoch time
VISIBILITY_TIMEOUT = 100.0  # the Redis transport's ack timeout the gate is told about

TYPES = {
    "build": JobType("build", priority=8, conflict_group="repo"),
    "urgent": JobType("urgent", priority=9),
    "deploy": JobType("deploy", priority=8, max_concurrency=1),
    "export": JobType("export", priority=8, rate="2/s"),  # one start each half second
}


class Message:
    """Kombu's message, as far as the gate touches it."""

    def __init__(self, headers: dict[str, Any]) -> None:
        self.headers = dict(headers)
        self.delivery_info = {"exchange": "", "routing_key": "celery"}
        self.properties: dict[str, Any] = {}
        self.body = b"[[], {}, {}]"
        self.content_type = "application/json"
        self.content_encoding = "utf-8"
        self.acknowledged = False

    def ack(self) -> None:
        self.acknowledged = True

    def ack_log_error(self, logger: Any, errors: Any) -> None:
        self.ack()


class Req:
    """Celery's ``Request``, as far as the gate reads it (see the module docstring).

    ``headers``: more message headers (a ``fair_republished``, a ``fair_submitted``, ...);
    ``retries``: Celery's count of this task's retries (a retry is a job of its own).
    """

    task = SimpleNamespace(send_events=False)
    expires = None
    _eventer = None  # task events off, as by default

    def __init__(
        self,
        task_id: str,
        job_type: str,
        key: str,
        job_id: str | None = None,
        *,
        retries: int = 0,
        headers: dict[str, Any] | None = None,
    ) -> None:
        self.id = task_id
        self.name = f"tasks.{job_type}"
        self.request_dict: dict[str, Any] = {
            "id": task_id,
            "job_type": job_type,
            "fairness_key": key,
            "retries": retries,
        }
        if job_id is not None:
            self.request_dict["job_id"] = job_id
        self.request_dict.update(headers or {})
        self._message = Message(self.request_dict)
        self.is_revoked = False
        self._already_revoked = False
        self.rejected = False
        self.events: list[str] = []

    @property
    def acknowledged(self) -> bool:
        return self._message.acknowledged

    def acknowledge(self) -> None:
        self._message.ack()

    def reject(self, requeue: bool = False) -> None:
        self.rejected = True

    def send_event(self, type: str, **fields: Any) -> None:
        self.events.append(type)

    def revoked(self) -> bool:
        if self._already_revoked:
            return True
        if self.is_revoked or self.id in worker_state.revoked:
            # Celery acknowledges a revoked request and reports it, once
            self._already_revoked = True
            self.acknowledge()
            self.send_event("task-revoked")
        return self._already_revoked

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        pass

    def on_success(self, result: Any) -> None:
        self.acknowledge()

    def on_failure(self, einfo: Any) -> None:
        self.acknowledge()


def celery_revoke(monkeypatch: pytest.MonkeyPatch, *task_ids: str) -> None:
    """What Celery's ``revoke`` command does on the worker: ``task_ids`` join its revoked set
    (a copy of its own for the test that calls this, given back by ``monkeypatch``)."""
    revoked = LimitedSet(maxlen=50_000)
    revoked.update(worker_state.revoked)
    revoked.update(task_ids)
    monkeypatch.setattr(worker_state, "revoked", revoked)


class Pool:
    """The pool behind ``process_task``: records what the gate hands over, in order."""

    def __init__(self, size: int) -> None:
        self.num_processes = size
        self.gate: Gate | None = None
        self.handed: list[Req] = []
        self.peak = 0  # the most runs the pool had at once
        self._options: dict[str, dict[str, Any]] = {}

    def process_task(self, req: Req) -> None:
        assert self.gate is not None
        options = {
            "correlation_id": req.id,
            "accept_callback": req.on_accepted,
            "callback": req.on_success,
            "error_callback": req.on_failure,
        }
        self.handed.append(req)
        self._options[req.id] = self.gate.wrap_callbacks(("task", req.id, {}), options)
        self.peak = max(self.peak, len(self._options))

    def finish(self, req: Req) -> None:
        """The run of ``req`` ended well: the pool's result callback."""
        self._options.pop(req.id)["callback"](None)

    def ids(self) -> list[str]:
        return [r.id for r in self.handed]

    def running(self) -> list[Req]:
        """The requests handed over whose runs have not ended, in the order handed."""
        return [r for r in self.handed if r.id in self._options]


class Producer:
    def __init__(self, sent: list[dict[str, Any]]) -> None:
        self.sent = sent

    def publish(self, body: bytes, **options: Any) -> None:
        self.sent.append(options)


class App:
    """The Celery app, where the gate publishes a message back to the broker."""

    def __init__(self) -> None:
        self.conf = SimpleNamespace(
            broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT}
        )
        self.published: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def producer_or_acquire(self) -> Iterator[Producer]:
        yield Producer(self.published)


class Timer:
    """Kombu's ``Timer``, as far as the gate books on it (``call_after``), on the world's
    clock: ``fire_due`` runs what is due, as the worker's loop would."""

    def __init__(self, clock: SimClock) -> None:
        self.clock = clock
        self.entries: list[SimpleNamespace] = []

    def call_after(self, secs: float, fun: Any, args: tuple = (), kwargs: Any = None) -> Any:
        entry = SimpleNamespace(at=self.clock.now() + secs, fun=fun, args=args, cancelled=False)
        entry.cancel = lambda: setattr(entry, "cancelled", True)
        self.entries.append(entry)
        return entry

    @staticmethod
    def cancel(entry: Any) -> None:  # as Kombu's Timer.cancel(tref)
        entry.cancel()

    def booked(self) -> list[float]:
        """When each entry not cancelled nor fired falls, earliest first."""
        return sorted(e.at for e in self.entries if not e.cancelled)

    def fire_due(self) -> int:
        """Run every entry due by now (and those they book that are due); how many ran."""
        ran = 0
        while due := [e for e in self.entries if not e.cancelled and e.at <= self.clock.now()]:
            for entry in due:
                self.entries.remove(entry)
                entry.fun(*entry.args)
                ran += 1
        return ran


class World:
    """One gate with its parts, on one simulated clock (its wall and monotonic readings).

    ``slots``: the pool's size; ``lookahead`` and ``sizer``: the gate's reserve, as
    ``plan_reserve`` would give them (the scheduler then has ``slots + lookahead`` places, as
    ``Gate.for_worker`` builds it); ``shared``: the engine decides over the memory store
    (``False``: this worker alone, no store), ``store`` another world's, to share it (one
    fleet on one clock). ``settings``: ``fair_*`` settings.
    """

    def __init__(
        self,
        slots: int,
        *,
        lookahead: int = 0,
        sizer: ReserveDepth | None = None,
        shared: bool = True,
        store: MemoryStore | None = None,
        name: str = "w1",
        **settings: Any,
    ) -> None:
        self.clock = SimClock(EPOCH) if store is None else store.clock
        self.settings = FairSettings.from_mapping({"fair_shards": 1, **settings})
        self.pool = Pool(slots)
        self.app = App()
        self.timer = Timer(self.clock)
        self.consumer = SimpleNamespace(
            app=self.app, pool=self.pool, hub=None, qos=None, timer=self.timer
        )
        self.store = MemoryStore(clock=self.clock) if store is None else store
        scheduler = Scheduler(
            self.settings.scheduler_config(slots + lookahead), self.clock, TYPES.values()
        )
        counters = Counters()
        engine = Engine(
            scheduler,
            self.store if shared else None,
            worker=name,
            clock=self.clock,
            observer=counters,
        )
        self.gate = Gate(
            self.consumer,
            self.settings,
            TYPES,
            self.pool.process_task,
            scheduler=scheduler,
            engine=engine,
            counters=counters,
            observer=counters,
            driver="redis",
            lookahead=lookahead,
            sizer=sizer,
            wall=self.clock,
            monotonic=self.clock,
        )
        self.pool.gate = self.gate
        self.gate.attach(self.consumer, self.pool)
        self.gate.on_connected()

    def deliver(self, task_id: str, job_type: str = "build", key: str = "a", **kw: Any) -> Req:
        """The broker delivers a fair message: Celery hands its request to the gate."""
        req = Req(task_id, job_type, key, **kw)
        self.gate.on_request(req)
        return req

    def redeliver(self, copy: dict[str, Any]) -> Req:
        """The broker delivers a copy the gate published (``app.published``), headers and all."""
        headers = dict(copy["headers"])
        req = Req(
            headers.pop("id"),
            headers.pop("job_type"),
            headers.pop("fairness_key"),
            headers.pop("job_id", None),
            retries=headers.pop("retries"),
            headers=headers,
        )
        self.gate.on_request(req)
        return req

    def run(self, req: Req, seconds: float) -> None:
        """``req``'s run lasts ``seconds`` from now, then ends well."""
        self.clock.advance(seconds)
        self.pool.finish(req)

    def stats(self) -> dict[str, Any]:
        """What ``inspect stats`` shows of the gate."""
        return self.gate.pool_info()
