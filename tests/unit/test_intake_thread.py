"""Parts of the intake that need no broker, with stand-ins for what they use (the intakes
themselves run against the real brokers in tests/integration/test_intake.py)."""

from __future__ import annotations

import collections
import contextlib
import logging
import threading

import redis

from celery_fair.worker.intake import IntakeThread
from celery_fair.worker.intake.amqp import _Confirms


class OutageThenBack:
    """Raises redis-py's ConnectionError for the first ``failures`` calls, then moves nothing."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.back = threading.Event()

    def drain(self, queues):
        self.calls += 1
        if self.calls <= self.failures:
            raise redis.ConnectionError("Connection refused")
        self.back.set()
        return 0

    def close(self):
        self.closed = True


def test_the_intake_rides_out_an_outage_with_one_warning_and_carries_on(caplog):
    intake = OutageThenBack(failures=3)
    thread = IntakeThread(intake, lambda: ["q"], interval=0.01)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="celery_fair.worker.intake"):
        thread.start()
        assert intake.back.wait(5)
        thread.stop()
    assert not thread.is_alive()
    assert intake.closed
    messages = [r.getMessage() for r in caplog.records if r.name == "celery_fair.worker.intake"]
    assert [m.split(":")[1].strip().split(" (")[0] for m in messages] == [
        "cannot move messages",
        "moving messages again.",
    ]


class StandInChannel:
    """What _Confirms uses of a py-amqp channel: confirm_select and the events table."""

    def __init__(self) -> None:
        self.events: dict = collections.defaultdict(set)

    def confirm_select(self) -> None:
        pass


def test_confirms_that_arrive_out_of_order_add_up_only_when_every_copy_is_confirmed():
    confirms = _Confirms(StandInChannel())
    # As RabbitMQ confirmed ten copies bound for several queues (seen on 3.10):
    for tag, multiple in [(1, False), (3, False), (2, False), (5, True), (9, False), (7, False)]:
        confirms._ack(tag, multiple)
    assert confirms.upto == 5  # 6 and 8 are not confirmed yet
    confirms._ack(8, True)
    assert confirms.upto == 9
    confirms._ack(10, False)
    assert confirms.upto == 10
    assert not confirms.nacked


class Reroutes:
    """A Redis intake that moves nothing from queues and ``plan[shard]`` stragglers from each
    shard it is told of, recording when."""

    def __init__(self, plan: dict[str, int]) -> None:
        self.plan = dict(plan)
        self.calls: list[str] = []
        self.done = threading.Event()
        self.drains = 0

    def drain(self, queues):
        self.drains += 1
        return 0

    def drain_shards(self, shards):
        [shard] = shards
        self.calls.append(shard)
        moved = self.plan.pop(shard, 0)
        if not self.plan:
            self.done.set()
        return moved

    def close(self):
        pass


def test_stragglers_told_of_are_rerouted_at_once_once_per_shard_and_counted_by_queue():
    from celery_fair.observe import Counters

    counters = Counters()
    intake = Reroutes({"q.fair.3": 16, "q.fair.5": 4})
    # an interval far longer than the test: only being told wakes the thread
    thread = IntakeThread(intake, lambda: ["q"], 60.0, observer=counters)  # type: ignore[arg-type]
    for _ in range(50):  # the gate tells it of every straggler it receives
        assert thread.reroute_soon("q.fair.3")
    thread.start()
    try:
        assert thread.reroute_soon("q.fair.5")  # wakes it, if it waits
        assert intake.done.wait(5)
    finally:
        thread.stop()
    assert sorted(intake.calls) == ["q.fair.3", "q.fair.5"]  # one call each, not 51
    assert counters.counts["rerouted"] == 20


def test_a_wake_for_stragglers_reroutes_them_and_leaves_the_queues_to_their_interval():
    # Given an intake thread that drains its queues every minute, started (it drains once),
    intake = Reroutes({"q.fair.3": 2, "q.fair.5": 1})
    thread = IntakeThread(intake, lambda: ["q"], 60.0)  # type: ignore[arg-type]
    thread.start()
    try:
        # when the gate tells it of stragglers in one shard, then in another,
        assert thread.reroute_soon("q.fair.3")
        for _ in range(500):
            if intake.calls:
                break
            threading.Event().wait(0.01)
        assert thread.reroute_soon("q.fair.5")
        assert intake.done.wait(5)
    finally:
        thread.stop()
    # then each is rerouted at its wake, and the queues were drained only the first time.
    assert intake.calls == ["q.fair.3", "q.fair.5"]
    assert intake.drains == 1


def test_an_intake_that_cannot_reroute_says_so():
    thread = IntakeThread(OutageThenBack(0), list, 60.0)  # type: ignore[arg-type]
    assert thread.reroute_soon("q.fair.3") is False  # RabbitMQ's: its gate reads past them


class SlowReplies:
    """An app whose ``inspect().active_queues()`` waits until ``release`` is set, as a
    broadcast waits its timeout for the workers' replies."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.release = threading.Event()
        self.control = self

    def inspect(self, timeout, connection):
        return self

    def connection_for_read(self):
        return contextlib.nullcontext()

    def active_queues(self):
        self.asked.set()
        self.release.wait(10)
        return {}


class Drains:
    """An intake that counts its drains and moves nothing."""

    def __init__(self) -> None:
        self.calls = 0
        self.closed = False

    def drain(self, queues):
        self.calls += 1
        return 0

    def close(self):
        self.closed = True


def test_the_look_for_plain_consumers_never_holds_up_the_intake():
    # Given an intake whose look for plain workers waits on their replies (up to a second in
    # the product, here until released),
    app, intake = SlowReplies(), Drains()
    thread = IntakeThread(intake, lambda: ["q"], 0.001, app=app, first_check=0.0)  # type: ignore[arg-type]
    thread.start()
    try:
        assert app.asked.wait(5)
        # while it waits, the queue is drained on and on: a message published now moves at once
        before = intake.calls
        deadline = threading.Event()
        for _ in range(500):
            if intake.calls >= before + 5:
                break
            deadline.wait(0.01)
        assert intake.calls >= before + 5, (before, intake.calls)
        assert not app.release.is_set()
    finally:
        app.release.set()
        thread.stop()
    assert not thread.is_alive()
    assert intake.closed
