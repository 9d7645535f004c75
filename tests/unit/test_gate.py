"""The worker's gate alone: a real ``Gate`` over a real ``Scheduler``, ``Engine`` and
``MemoryStore``, on simulated clocks, with no broker and no worker.

What a broker and Celery's worker would do around the gate is played by the smallest stand-ins
that do it honestly:

- ``Req`` stands in for Celery's ``Request``: the gate reads its ``id``, ``name``,
  ``request_dict`` (the message headers), ``expires``, ``revoked()``, ``acknowledge()``,
  ``reject()``, ``send_event()`` and its Kombu message (``_message``: ``ack``, ``headers``,
  ``delivery_info``). Its ``revoked()`` does what Celery's does for a revoked id (acknowledge,
  report it), and its success callback acknowledges as Celery does after a run.
- ``Pool`` stands in for the fair pool: ``process_task`` is Celery's path to it, and it records
  each request handed over with the callbacks the gate wrapped (as ``FairPool.apply_async``
  does); ``finish`` ends a run the way the pool's result callback does.
- ``App`` stands in for the Celery app where the gate returns a message to the broker: its
  producer records what is published.

The broker adds nothing to the rules tested here (hold, admission order, conflicts, caps,
cancel, reprioritise, the ack-timeout refresh): the real-worker tests in tests/integration and
tests/e2e keep what brokers do (acks, redelivery, shards, windows, killed processes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from celery_fair.core import JobType, Scheduler, SimClock
from celery_fair.engine import Engine
from celery_fair.observe import Counters
from celery_fair.settings import FairSettings
from celery_fair.store.memory import MemoryStore
from celery_fair.worker.gate import HOLD_FRACTION, Gate
from celery_fair.worker.headers import REPUBLISHED, SUBMITTED, TOKEN

EPOCH = 1_700_000_000.0  # the simulated wall clock starts at a plausible epoch time
VISIBILITY_TIMEOUT = 100.0  # the Redis transport's ack timeout the gate is told about

TYPES = {
    "build": JobType("build", priority=8, conflict_group="repo"),
    "urgent": JobType("urgent", priority=9),
    "deploy": JobType("deploy", priority=8, max_concurrency=1),
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
    """Celery's ``Request``, as far as the gate reads it (see the module docstring)."""

    task = SimpleNamespace(send_events=False)
    expires = None
    _eventer = None  # task events off, as by default
    _already_revoked = False

    def __init__(self, task_id: str, job_type: str, key: str, job_id: str | None = None) -> None:
        self.id = task_id
        self.name = f"tasks.{job_type}"
        self.request_dict: dict[str, Any] = {
            "job_type": job_type,
            "fairness_key": key,
            "retries": 0,
        }
        if job_id is not None:
            self.request_dict["job_id"] = job_id
        self._message = Message(self.request_dict)
        self.is_revoked = False
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
        if self.is_revoked:  # Celery acknowledges a revoked request and reports it
            self.acknowledge()
            self.send_event("task-revoked")
        return self.is_revoked

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        pass

    def on_success(self, result: Any) -> None:
        self.acknowledge()

    def on_failure(self, einfo: Any) -> None:
        self.acknowledge()


class Pool:
    """The pool behind ``process_task``: records what the gate hands over, in order."""

    def __init__(self, size: int) -> None:
        self.num_processes = size
        self.gate: Gate | None = None
        self.handed: list[Req] = []
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

    def finish(self, req: Req) -> None:
        """The run of ``req`` ended well: the pool's result callback."""
        self._options.pop(req.id)["callback"](None)

    def ids(self) -> list[str]:
        return [r.id for r in self.handed]


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


class World:
    """One gate with its parts, on one simulated clock (its wall and monotonic readings)."""

    def __init__(self, slots: int, **settings: Any) -> None:
        self.clock = SimClock(EPOCH)
        self.settings = FairSettings.from_mapping({"fair_shards": 1, **settings})
        self.pool = Pool(slots)
        self.app = App()
        self.consumer = SimpleNamespace(app=self.app, pool=self.pool, hub=None, qos=None)
        self.store = MemoryStore(clock=self.clock)
        scheduler = Scheduler(self.settings.scheduler_config(slots), self.clock, TYPES.values())
        counters = Counters()
        engine = Engine(scheduler, self.store, worker="w1", clock=self.clock, observer=counters)
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
            wall=self.clock,
            monotonic=self.clock,
            worker_id="w1",
        )
        self.pool.gate = self.gate
        self.gate.attach(self.consumer, self.pool)
        self.gate.on_connected()

    def deliver(self, task_id: str, job_type: str = "build", key: str = "a", **kw: Any) -> Req:
        req = Req(task_id, job_type, key, **kw)
        self.gate.on_request(req)
        return req


def test_a_job_is_held_admitted_handed_to_the_pool_and_finished_with_its_token() -> None:
    w = World(slots=1)
    first = w.deliver("t1", key="a")
    assert w.pool.ids() == ["t1"]
    assert isinstance(first.request_dict[TOKEN], int)  # the fencing token travels with it
    assert w.gate.job_status("t1") == {"state": "running", "effective_priority": 8}

    second = w.deliver("t2", key="b")  # no free slot: held, unacknowledged
    assert w.pool.ids() == ["t1"]
    assert list(w.gate.held) == ["t2"]
    assert not second.acknowledged
    assert w.gate.job_status("t2")["state"] == "held"

    w.clock.advance(3.0)
    w.pool.finish(first)  # its slot frees: the held job starts
    assert first.acknowledged
    assert w.pool.ids() == ["t1", "t2"]
    assert not w.gate.held
    assert w.gate.pool_info()["fair-admitted"] == 2
    w.pool.finish(second)
    assert w.gate.pool_info()["fair-running"] == 0


def test_a_conflict_holds_the_second_job_until_the_first_finishes() -> None:
    w = World(slots=2)
    first = w.deliver("t1", key="a", job_id="repo-1")
    w.deliver("t2", key="b", job_id="repo-1")  # same repository: may not run beside it
    assert w.pool.ids() == ["t1"]  # though a slot is free
    status = w.gate.job_status("t2")
    assert status["blocked_by"] == ["conflict"]
    assert status["conflict"]  # names what it waits for
    w.deliver("t3", key="c", job_id="repo-2")  # another repository: takes the free slot
    assert w.pool.ids() == ["t1", "t3"]

    w.pool.finish(first)
    assert w.pool.ids() == ["t1", "t3", "t2"]


def test_a_type_cap_holds_a_second_job_of_the_type_while_other_types_run() -> None:
    w = World(slots=3)
    first = w.deliver("d1", job_type="deploy", key="a")
    w.deliver("d2", job_type="deploy", key="b")
    w.deliver("b1", job_type="build", key="c")
    assert w.pool.ids() == ["d1", "b1"]
    assert w.gate.job_status("d2")["blocked_by"] == ["type_cap"]

    w.pool.finish(first)
    assert w.pool.ids() == ["d1", "b1", "d2"]


def test_cancel_drops_a_held_job_once_revoked_and_never_starts_it() -> None:
    w = World(slots=1)
    first = w.deliver("t1", key="a")
    held = w.deliver("t2", key="b")
    assert w.gate.cancel("t2") is None  # not in the revoked set: left alone
    assert "t2" in w.gate.held

    held.is_revoked = True  # fair_cancel puts it in Celery's revoked set first
    assert w.gate.cancel("t2") == "cancelled"
    assert not w.gate.held
    assert held.acknowledged
    assert held.events == ["task-revoked"]
    assert w.gate.cancel("t1") == "already_running"
    assert w.gate.cancel("nowhere") is None

    w.pool.finish(first)
    assert w.pool.ids() == ["t1"]  # the cancelled job never reached the pool


def test_reprioritize_moves_a_held_job_ahead_of_one_that_came_before_it() -> None:
    w = World(slots=1)
    first = w.deliver("t1", key="a")
    w.deliver("t2", key="b")
    w.clock.advance(1.0)
    w.deliver("t3", key="c")  # later than t2: it would start after it
    assert w.gate.reprioritize("t3", 9) == "ok"
    assert w.gate.job_status("t3")["priority"] == 9
    assert w.gate.reprioritize("t1", 9) == "already_running"

    w.pool.finish(first)
    assert w.pool.ids() == ["t1", "t3"]


def test_a_priority_given_before_the_job_arrives_is_taken_on_arrival() -> None:
    w = World(slots=1)
    first = w.deliver("t1", key="a")
    w.deliver("t2", key="b")
    assert w.gate.reprioritize("t3", 9) is None  # not here yet: remembered
    w.deliver("t3", key="c")
    w.pool.finish(first)
    assert w.pool.ids() == ["t1", "t3"]


def test_the_sweep_returns_a_message_held_past_the_ack_timeout_fraction() -> None:
    w = World(slots=1)
    max_hold = VISIBILITY_TIMEOUT * HOLD_FRACTION
    assert w.gate.max_hold == pytest.approx(max_hold)
    running = w.deliver("t1", key="a")
    held = w.deliver("t2", key="b")
    arrival = w.clock.now()

    w.clock.advance(max_hold - 1.0)
    w.gate.sweep()
    assert "t2" in w.gate.held
    assert not w.app.published

    w.clock.advance(2.0)
    w.gate.sweep()
    assert "t2" not in w.gate.held
    assert held.acknowledged  # acked only once its copy was published
    [copy] = w.app.published
    assert copy["routing_key"] == "celery"
    assert copy["headers"][REPUBLISHED] == 1
    assert copy["headers"][SUBMITTED] == pytest.approx(arrival)  # keeps its place
    assert w.gate.pool_info()["fair-refreshed"] == 1
    assert w.pool.ids() == ["t1"]
    assert not running.acknowledged
