"""Lanes on the producer side (routing.Lanes): a key that turns heavy asks the shared store
for its lane and goes there, every other key to its shard; the map is read about once a
second; a store that fails is never raised into a publish. Read back from Kombu's in-memory
transport."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_fair import fair_task
from celery_fair.core.lanes import LaneMap, LaneTable
from celery_fair.protocol import base_name, lane_index, lane_name, shard_index
from celery_fair.routing import Lanes, Shards, consume_shards, shard_name, shard_of


class TableStore:
    """The store's lane calls over one LaneTable (the memory store's rule), counting calls;
    ``fail`` makes each call raise."""

    def __init__(self, size: int = 4) -> None:
        self.table = LaneTable(size=size)
        self.now = 0.0
        self.calls: list[str] = []
        self.fail = False

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fail:
            raise ConnectionError("store down")

    def lanes(self, version: int) -> LaneMap | None:
        self._call("lanes")
        found = self.table.map()
        return None if found.version == version else found

    def ask_lane(self, fairness_key: str) -> int | None:
        self._call("ask_lane")
        return self.table.ask(fairness_key, self.now)

    def renew_lanes(self, keys: Any) -> None:
        self._call("renew_lanes")
        self.table.renew(keys, self.now)


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def app():
    app = Celery("t", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = "q"
    app.conf.fair_lane_threshold = 4
    yield app
    app.close()


def lanes_of(app: Any, store: Any, clock: Clock) -> Lanes:
    lanes = Lanes(app, clock=clock)
    lanes._opened, lanes._store = True, store
    import celery_fair.routing as routing

    routing._LANES[app] = lanes
    return lanes


def sent(app: Any, task: Any, keys: list[str]) -> dict[str, int]:
    """Publish one job per key in ``keys``, in order; where each went, by queue, counted."""
    for key in keys:
        task.apply_async(["x"], fairness_key=key)
    found: dict[str, int] = {}
    with app.connection_for_read() as conn:
        for name in list(app.amqp.queues):
            queue = conn.SimpleQueue(name)
            while queue.qsize():
                queue.get(timeout=1).ack()
                found[name] = found.get(name, 0) + 1
            queue.close()
    return found


def test_lane_names_are_not_shard_names_and_name_their_queue() -> None:
    assert lane_name("q", 3) == "q.fair.lane.3"
    assert (lane_index("q.fair.lane.3"), shard_index("q.fair.lane.3")) == (3, None)
    assert (lane_index("q.fair.3"), base_name("q.fair.lane.12")) == (None, "q")


def test_a_key_past_the_threshold_goes_to_its_lane_from_that_publish_on(app: Any) -> None:
    store, clock = TableStore(), Clock()
    lanes_of(app, store, clock)

    @fair_task(app=app, type="clone", priority=8)
    def clone(repo: str) -> str:
        return repo

    # A burst of 10 from one key, a light key among it: the first 4 (the threshold) go to the
    # key's shard, the rest to its lane; the light key to its shard.
    found = sent(app, clone, ["A"] * 6 + ["light"] + ["A"] * 4)
    heavy_shard = shard_name("q", shard_of("A", 8))
    light_shard = shard_name("q", shard_of("light", 8))
    assert found[lane_name("q", 0)] == 6
    assert found[heavy_shard] == 4 + (heavy_shard == light_shard)
    assert store.calls.count("ask_lane") == 1  # once per heavy episode
    assert "q.fair.lane.0" in app.amqp.queues  # registered, as shards are


def test_the_map_is_read_about_once_a_second_and_keys_that_lost_their_lane_go_back(app) -> None:
    store, clock = TableStore(), Clock()
    lanes = lanes_of(app, store, clock)
    for _ in range(5):
        assert lanes.lane_for("A") in (None, 0)
    assert lanes.lane_for("A") == 0
    reads = store.calls.count("lanes")
    for _ in range(50):
        lanes.lane_for("A")
    assert store.calls.count("lanes") == reads  # no read within the second
    clock.t += 1.0
    lanes.lane_for("A")  # a second later: renews A (still heavy here) and reads the map
    assert store.calls[-2:] == ["renew_lanes", "lanes"]
    # The fleet released A's lane (its lease lapsed, its lane empty): read within a second,
    # A goes back to its shard.
    store.table.renew(["A"], -100.0)
    for t in (11.0, 12.0):
        store.table.sweep({0}, {0}, t)
    clock.t += 20.0
    assert lanes.lane_for("A") is None


def test_a_failing_store_is_logged_once_and_never_raised_into_a_publish(app, caplog) -> None:
    store, clock = TableStore(), Clock()
    lanes = lanes_of(app, store, clock)
    for _ in range(5):
        lanes.lane_for("A")
    assert lanes.lane_for("A") == 0
    store.fail = True
    clock.t += 1.0
    assert lanes.lane_for("A") == 0  # the last map still holds
    for _ in range(10):
        assert lanes.lane_for(f"B{_}") is None
    for _ in range(5):
        lanes.lane_for("C")  # C turns heavy: the ask fails, C stays in its shard
    assert lanes.lane_for("C") is None
    assert caplog.text.count("could not") == 1
    store.fail = False
    clock.t += 1.0
    lanes.lane_for("A")
    assert "answers again" in caplog.text


def test_no_store_means_no_lanes_and_no_counting(app) -> None:
    lanes = lanes_of(app, None, Clock())
    lanes._opened = False  # opened on first use: this app has no store (memory broker)
    assert lanes.lane_for("A") is None
    assert not lanes.enabled


def test_lanes_off_or_one_shard_route_every_key_to_its_shard() -> None:
    for conf in ({"fair_lanes": 0}, {"fair_shards": 1}):
        app = Celery("t", broker="memory://", set_as_current=False)
        app.conf.update(conf)
        assert not Lanes(app).enabled
        app.close()


def test_a_fair_worker_with_lanes_consumes_them_and_follows_add_and_cancel_consumer(app):
    app.amqp.queues.select(["q"])
    assert consume_shards(app, lanes=2) == ["q"]
    consumed = set(app.amqp.queues.consume_from)
    assert {"q.fair.lane.0", "q.fair.lane.1"} <= consumed
    assert "q.fair.lane.2" not in consumed
    assert Shards.of(app).consumed_lanes == 2


def test_a_broker_that_fails_to_move_a_keys_stragglers_is_logged_once_and_never_raised(
    app, caplog
) -> None:
    # Given a producer whose broker refuses the move that goes with a new lane (a Redis
    # broker that went away: the script call raises),
    store, clock = TableStore(), Clock()
    lanes = lanes_of(app, store, clock)
    calls: list[str] = []

    def move(keys: Any, args: Any) -> Any:
        calls.append(args[7])  # the shard moved from
        raise ConnectionError("broker down")

    lanes._mover = (move, lambda queue: [queue])
    # when two keys turn heavy, one after the other,
    for key in ("A", "B"):
        for _ in range(5):
            lanes.lane_for(key, "q")
    # then each asked to move from its own shard, the publishes went on to the lanes, and the
    # failure was logged once.
    assert calls == [shard_name("q", shard_of(k, 8)) for k in ("A", "B")]
    assert (lanes.lane_for("A", "q"), lanes.lane_for("B", "q")) == (0, 1)
    assert lanes.rerouted == 0
    assert caplog.text.count("could not move") == 1
