"""The fleet's lane table in the shared store (Store.lanes ... sweep_lanes; core/lanes.py;
docs/design.md 5f), the same way in every store: in memory, Redis, a Redis Cluster and behind
Sentinel (the ``kind`` fixture). Time is each store's own clock, so the tests that need a lease
to lapse wait for it (the agreement with the in-memory store on random sequences, with a clock
the test moves: test_lanes_agree.py)."""

from __future__ import annotations

import itertools
import time

import pytest
from harness import wait_until

from celery_fair.core import CostLifecycle
from celery_fair.core.lanes import ANNOUNCE_GRACE, GRACE
from celery_fair.errors import ConfigurationError

NEVER = CostLifecycle.never()


def wait_past(moment: float) -> None:
    """Until the clock (the machine's: every store under test runs on it) is past ``moment``."""
    wait_until(lambda: time.time() > moment, moment - time.time() + 5, f"the time {moment}")


def routed(store) -> dict[str, int]:
    return dict(store.lanes(-1).lanes)


def test_a_heavy_key_has_a_lane_of_its_own_until_every_lane_has_one_then_the_fewest_share(
    make_store,
):
    store = make_store(lifecycle=NEVER)
    store.heartbeat("w1", [], [])
    store.sweep_lanes("w1", 3, [], [])
    assert [store.ask_lane(k) for k in "abcde"] == [0, 1, 2, 0, 1]
    assert store.ask_lane("a") == 0  # a key keeps its lane
    assert routed(store) == {"a": 0, "b": 1, "c": 2, "d": 0, "e": 1}


def test_a_live_worker_that_never_announces_stops_the_lanes_once_past_the_grace(make_store):
    store = make_store(lifecycle=NEVER)
    assert store.ask_lane("a") is None  # no worker at all
    store.heartbeat("w1", [], [])
    store.heartbeat("w2", [], [])
    assert store.ask_lane("a") is None  # live workers, none announced
    store.sweep_lanes("w1", 4, [], [])
    # w2 went live just now and has not said yet, as a fair worker that starts: left out,
    assert store.ask_lane("a") == 0
    assert routed(store) == {"a": 0}

    def no_lanes() -> bool:  # w1 sweeps on, w2 lives on and never says (an older release)
        store.heartbeat("w2", [], [])
        store.sweep_lanes("w1", 4, [], [])
        return store.ask_lane("b") is None

    # until it has been silent for ANNOUNCE_GRACE: then no lanes, and a leaves its lane;
    wait_until(no_lanes, ANNOUNCE_GRACE + 10, "w2's silence to stop the lanes")
    assert routed(store) == {}
    # once it says it consumes lanes, they are given again.
    store.sweep_lanes("w2", 4, [], [])
    assert store.ask_lane("a") == 0


def test_a_worker_counts_from_its_own_sweep_before_its_first_heartbeat(make_store):
    store = make_store(lifecycle=NEVER)
    store.sweep_lanes("w1", 2, [], [])  # no lease yet: it calls, so it consumes its lanes
    assert [store.ask_lane(k) for k in "ab"] == [0, 1]


def test_the_fleet_agrees_on_the_fewest_lanes_any_live_worker_consumes(make_store):
    store = make_store(lifecycle=NEVER)
    for worker in ("w1", "w2"):
        store.heartbeat(worker, [], [])
    store.sweep_lanes("w1", 16, [], [])
    store.sweep_lanes("w2", 2, [], [])
    assert [store.ask_lane(k) for k in "abc"] == [0, 1, 0]
    # w2 now consumes one lane: the key on lane 1 leaves it at once (w2 does not read it)
    store.sweep_lanes("w2", 1, [], [])
    assert routed(store) == {"a": 0, "c": 0}
    # asked again, it gets a lane the fleet still has
    assert store.ask_lane("b") == 0
    assert routed(store) == {"a": 0, "b": 0, "c": 0}


def test_a_dead_workers_announcement_stops_counting_once_its_lease_lapsed(make_store):
    store = make_store(lifecycle=NEVER, lease=0.5)
    for worker in ("w1", "w2"):
        store.heartbeat(worker, [], [])
    store.sweep_lanes("w1", 4, [], [])
    store.sweep_lanes("w2", 1, [], [])
    assert [store.ask_lane(k) for k in "ab"] == [0, 0]
    probes = (f"probe{i}" for i in itertools.count())

    def four_lanes() -> bool:  # w2 stopped; w1 beats and sweeps on
        store.heartbeat("w1", [], [])
        store.sweep_lanes("w1", 4, [], [])
        return store.ask_lane(next(probes)) != 0  # lanes 1-3 have no key yet

    wait_until(four_lanes, 10, "w2's lease to lapse and its one lane to stop counting")
    # Its announcement is forgotten: back, it is a worker that has not said yet, left out
    # for ANNOUNCE_GRACE (a fair worker says so within about a second of its start).
    store.heartbeat("w2", [], [])
    store.sweep_lanes("w1", 4, [], [])
    assert store.ask_lane("c") is not None
    store.sweep_lanes("w2", 4, [], [])
    assert store.ask_lane("c") is not None


def test_a_key_leaves_its_lane_once_its_lease_lapsed_and_two_sweeps_in_a_row_found_it_empty(
    make_store,
):
    store = make_store(lifecycle=NEVER, lane_seconds=1.0)
    start = time.time()
    store.sweep_lanes("w1", 2, [], [])
    assert [store.ask_lane(k) for k in "ab"] == [0, 1]
    for _ in range(3):  # empty lanes, but the leases run
        store.sweep_lanes("w1", 2, [0, 1], [0, 1])
    assert routed(store) == {"a": 0, "b": 1}
    wait_past(start + 0.5)
    store.renew_lanes(["a", "unknown"])  # a producer still publishes a over the threshold
    wait_past(start + 1.05)  # b's lease lapsed, a's runs until 1.5 s at least
    store.sweep_lanes("w1", 2, [0, 1], [])  # a message in each lane: nobody leaves
    store.sweep_lanes("w1", 2, [0, 1], [0, 1])  # empty once
    assert routed(store) == {"a": 0, "b": 1}
    store.sweep_lanes("w1", 2, [0, 1], [0, 1])  # empty twice in a row
    assert routed(store) == {"a": 0}
    # b turns heavy again before its grace is over: its own lane back
    assert store.ask_lane("b") == 1
    assert routed(store) == {"a": 0, "b": 1}


def test_a_key_that_left_keeps_its_lane_from_other_keys_for_the_grace(make_store):
    store = make_store(lifecycle=NEVER, lane_seconds=0.1)
    store.sweep_lanes("w1", 3, [], [])
    start = time.time()
    assert store.ask_lane("b") == 0
    wait_past(start + 0.15)
    for _ in range(2):
        store.sweep_lanes("w1", 3, [0], [0])
    left = time.time()
    assert routed(store) == {}  # b left: producers route it to its shard
    assert store.ask_lane("c") == 1  # lane 0 is still b's, for its late messages
    wait_past(left + GRACE)
    store.sweep_lanes("w1", 3, [], [])  # the sweep after the grace frees it
    assert store.ask_lane("d") == 0
    assert routed(store) == {"c": 1, "d": 0}


def test_lanes_says_nothing_while_unchanged_and_gives_the_new_map_after_a_change(make_store):
    store = make_store(lifecycle=NEVER)
    first = store.lanes(-1)
    assert first is not None
    assert first.lanes == {}
    assert store.lanes(first.version) is None
    store.sweep_lanes("w1", 2, [0, 1], [0])  # lanes agreed: the map says so (its size)
    agreed = store.lanes(first.version)
    assert agreed is not None
    assert (agreed.lanes, agreed.size) == ({}, 2)
    store.sweep_lanes("w1", 2, [0, 1], [0])  # nothing new
    assert store.lanes(agreed.version) is None
    assert store.ask_lane("a") == 0
    changed = store.lanes(agreed.version)
    assert changed is not None
    assert changed.version != agreed.version
    assert changed.lanes == {"a": 0}
    store.renew_lanes(["a"])
    assert store.ask_lane("a") == 0
    assert store.lanes(changed.version) is None


def test_fairness_keys_and_worker_names_of_any_characters_round_trip(make_store):
    store = make_store(lifecycle=NEVER)
    keys = ["a|b", "k:1", "0|1|", "ключ", "", "😀 x y", "n:0", "w:w|1", "size", "version", "e:0"]
    store.sweep_lanes("w|1:x", 16, [], [])
    store.heartbeat("w|1:x", [], [])
    assert [store.ask_lane(k) for k in keys] == list(range(len(keys)))
    store.renew_lanes(keys)
    store.sweep_lanes("w|1:x", 16, range(16), [])
    assert routed(store) == {k: i for i, k in enumerate(keys)}


def test_a_sweep_with_a_bad_size_or_lane_is_refused_and_records_nothing(make_store):
    store = make_store(lifecycle=NEVER)
    for size, looked, empty in ((-1, [], []), (2, [0, -1], []), (2, [0], [1.5]), (True, [], [])):
        with pytest.raises(ValueError, match="sweep_lanes"):
            store.sweep_lanes("w1", size, looked, empty)
    assert store.ask_lane("a") is None  # no announcement was kept


def test_a_lane_lease_that_is_not_a_positive_number_is_refused(make_store):
    with pytest.raises(ConfigurationError, match="fair_lane_seconds"):
        make_store(lane_seconds=0)
