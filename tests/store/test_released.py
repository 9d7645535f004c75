"""Every call that releases running jobs publishes on ``{prefix}:released`` (lua/common.lua),
and in-process slots (slots.py) waiting in another process wake on it: on one Redis and on a
Redis Cluster, where a script's PUBLISH reaches a subscriber on any node."""

from __future__ import annotations

import threading
import time

import pytest
from test_contract import ask

from celery_fair import Slot
from celery_fair.core import CostLifecycle, JobType, SchedulerConfig
from celery_fair.slots import SlotScheduler
from celery_fair.store import Done

NEVER = CostLifecycle.never()


@pytest.fixture(params=["redis", "cluster"])
def kind(request):
    return request.param


class Listener:
    """The store's release announcements, read on a connection of their own."""

    def __init__(self, store) -> None:
        self.pubsub = store.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(store.released_channel)

    def next(self, timeout: float = 2.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=0.1)
            if message is not None:
                return int(message["data"])
        return None

    def close(self) -> None:
        self.pubsub.close()


def test_every_release_is_announced_with_how_many(make_store):
    store = make_store(lifecycle=NEVER, lease=0.5)
    listener = Listener(store)
    try:
        # An admission releases nothing: nothing is said.
        grants = store.admit("w1", [ask("a", job_id="x"), ask("b", job_id="y")]).grants
        assert listener.next(0.3) is None
        # A completion says one; an admission carrying two ends says two.
        store.finish("w1", [Done("a", grants[0].token, 0.1)])
        assert listener.next() == 1
        c = store.admit("w1", [ask("c", job_id="z")]).grants[0]
        assert listener.next(0.3) is None
        done = [Done("b", grants[1].token, 0.1), Done("c", c.token, None)]
        store.admit("w1", [], done)
        assert listener.next() == 2
        # A stale end releases nothing.
        store.finish("w1", [Done("a", grants[0].token, 0.1)])
        assert listener.next(0.3) is None
        # A dead worker's jobs, reclaimed when its lease expired, are announced too.
        store.admit("dead", [ask("d", job_id="x")])
        deadline = time.monotonic() + 10
        while not store.heartbeat("live", [], []).reclaimed:  # once its lease has expired
            assert time.monotonic() < deadline, "the dead worker's lease to expire"
        assert listener.next() == 1
    finally:
        listener.close()


SOLO = JobType("solo", 4, max_concurrency=1, default_cost=1.0)


def test_a_slot_waiting_in_one_process_wakes_on_a_release_in_another(make_store):
    # Given two processes' slot schedulers on the store, whose fallback look is 30 s away,
    stores = [make_store(lifecycle=NEVER, lease=300.0) for _ in range(2)]
    config = SchedulerConfig(4, lifecycle=NEVER)
    a, b = (SlotScheduler({"solo": SOLO}, config, s, poll_interval=30.0) for s in stores)
    try:
        for _ in range(3):
            # when one holds the only slot of "solo" and a caller of the other waits for it,
            inside = Slot("solo", scheduler=a, timeout=5)
            inside.__enter__()
            entered = []

            def body(entered=entered):
                with Slot("solo", scheduler=b, timeout=20):
                    entered.append(time.monotonic())

            refused = b.engine.observer.counts["refused"]
            t = threading.Thread(target=body)
            t.start()
            # refused (the type is full), and subscribed to the releases
            deadline = time.monotonic() + 10
            while b.engine.observer.counts["refused"] == refused or not b.subscribed.is_set():
                assert time.monotonic() < deadline, "the refusal and the subscription"
                time.sleep(0.01)
            assert not entered
            # then it enters right after the release, not at the next look.
            released = time.monotonic()
            inside.__exit__(None, None, None)
            t.join(20)
            assert entered
            assert entered[0] - released < 1.0, entered[0] - released
    finally:
        a.close()
        b.close()
