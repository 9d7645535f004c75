"""The lane watch alone (worker/lane_watch.py): which lanes it reports empty, and that it
reports to the store's lane table, which then lets a lapsed key go."""

from __future__ import annotations

from typing import Any

from celery_fair.core.lanes import LaneTable, agreed_size
from celery_fair.worker.lane_watch import LaneWatch, empty_lanes


class Store:
    """The store's side of a sweep, over a LaneTable, as the memory store keeps it."""

    def __init__(self) -> None:
        self.table = LaneTable(size=0, lease=10.0)
        self.sizes: dict[str, int] = {}
        self.now = 0.0
        self.fail = False

    def sweep_lanes(self, worker: str, size: int, looked: Any, empty: Any) -> None:
        if self.fail:
            raise ConnectionError("down")
        self.sizes[worker] = size
        self.table.resize(agreed_size(self.sizes.values()), self.now)
        self.table.sweep(set(empty), set(looked), self.now)

    def renew_lanes(self, keys: Any) -> None:
        self.table.renew(keys, self.now)


def test_a_lane_is_empty_only_if_it_is_empty_in_every_queue_consumed() -> None:
    waiting = {"a.fair.lane.0": 2, "b.fair.lane.2": 1}
    ready = lambda names: [waiting.get(n, 0) for n in names]  # noqa: E731
    assert empty_lanes(4, ["a", "b"], ready) == {1, 3}
    assert empty_lanes(4, ["a"], ready) == {1, 2, 3}


def test_the_watch_announces_its_lanes_and_a_lapsed_key_leaves_once_its_lane_is_empty() -> None:
    store = Store()
    waiting = {"q.fair.lane.0": 5}
    watch = LaneWatch(store, "w1", 2, lambda: ["q"], lambda ns: [waiting.get(n, 0) for n in ns])
    watch.look()
    assert store.table.size == 2  # announced: lanes are given out
    assert store.table.ask("A", 0.0) == 0
    store.now = 30.0  # A's lease lapsed, but its lane holds 5 messages: it stays
    for _ in range(3):
        watch.look()
    assert store.table.lane_of("A") == 0
    waiting.clear()  # drained
    watch.look()
    assert store.table.lane_of("A") == 0  # empty once
    watch.look()
    assert store.table.lane_of("A") is None  # twice: back to its shard


def test_a_watch_that_consumes_no_queue_reports_no_lane_empty_and_failures_are_logged_once(
    caplog: Any,
) -> None:
    store = Store()
    store.table.resize(2, 0.0)
    store.table.ask("A", 0.0)
    store.now = 30.0
    watch = LaneWatch(store, "w1", 2, list, lambda ns: [0 for _ in ns])
    for _ in range(3):
        watch.look()
    assert store.table.lane_of("A") == 0  # nothing looked at, nothing found empty
    store.fail = True
    watch.look()
    watch.look()
    assert caplog.text.count("could not look at the lanes") == 1


def test_a_key_the_worker_holds_a_backlog_of_is_renewed_and_keeps_its_lane() -> None:
    # Given a key with a lane but no producer renewing it (a worker asked for it, rule 3),
    store = Store()
    backlog = ["A"]
    ready = lambda names: [0 for _ in names]  # noqa: E731
    watch = LaneWatch(store, "w1", 2, lambda: ["q"], ready, renew=lambda: backlog)
    watch.look()
    assert store.table.ask("A", 0.0) == 0
    # while the worker holds a backlog of it, each look renews it: its lane stays, though the
    # broker's lane is empty (the worker took it all in),
    for now in (8.0, 16.0, 24.0):
        store.now = now
        watch.look()
    assert store.table.lane_of("A") == 0
    # and once the backlog is gone, its lease lapses and it leaves.
    backlog.clear()
    for now in (35.0, 36.0):
        store.now = now
        watch.look()
    assert store.table.lane_of("A") is None
