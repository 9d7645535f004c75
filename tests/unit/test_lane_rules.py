"""The lane rules alone (core/lanes.py): when a producer's key turns heavy, and how the fleet's
table gives lanes out and takes them back."""

from __future__ import annotations

import pytest

from celery_fair.core.lanes import (
    ANNOUNCE_GRACE,
    EMPTY_SWEEPS,
    Crowding,
    HeavyKeys,
    LaneTable,
    agreed_size,
    fleet_sizes,
)


def test_a_key_turns_heavy_at_the_publish_past_the_threshold_within_a_second() -> None:
    heavy = HeavyKeys(threshold=16)
    # A burst: the 17th publish within a second is the one that asks for a lane, once.
    turned = [heavy.publish("A", i * 0.001) for i in range(100)]
    assert turned.index(True) == 16
    assert turned.count(True) == 1
    assert heavy.over("A", 0.1)
    assert heavy.heavy(0.1) == ["A"]


def test_a_steady_key_below_the_threshold_per_second_never_turns_heavy() -> None:
    heavy = HeavyKeys(threshold=16)
    # 15 a second for a minute, and a burst of 16 at a second's edge: each window has <= 16.
    assert not any(heavy.publish("B", i / 15) for i in range(15 * 60))
    assert not heavy.over("B", 60.0)


def test_a_key_heavy_for_several_seconds_asks_once_per_window_and_idle_keys_are_forgotten() -> None:
    heavy = HeavyKeys(threshold=2)
    asks = [t for t in (i * 0.1 for i in range(30)) if heavy.publish("A", t)]
    assert len(asks) == 3  # one per one-second window (the producer asks only without a lane)
    heavy.publish("other", 10.0)  # a publish a horizon later prunes the idle keys
    assert heavy.heavy(10.0) == []
    assert "A" not in heavy._seen


def test_the_threshold_must_be_a_positive_count() -> None:
    with pytest.raises(ValueError, match="threshold"):
        HeavyKeys(threshold=0)


def test_the_fleet_agrees_on_the_fewest_lanes_and_on_none_while_a_worker_has_not_said() -> None:
    assert agreed_size([16, 16, 8]) == 8
    assert agreed_size([16, None]) == 0  # an older worker consumes no lanes
    assert agreed_size([]) == 0


def test_a_worker_that_just_started_takes_no_lanes_away_but_a_silent_one_does() -> None:
    silent: dict[str, float] = {}
    # w2 just went live and has not announced yet: the fleet keeps w1's lanes,
    assert fleet_sizes(["w1", "w2"], {"w1": 16}, silent, 100.0) == [16]
    assert fleet_sizes(["w1", "w2"], {"w1": 16}, silent, 100.0 + ANNOUNCE_GRACE - 0.5) == [16]
    # and once it announces, its own size counts;
    assert fleet_sizes(["w1", "w2"], {"w1": 16, "w2": 8}, silent, 103.0) == [16, 8]
    assert silent == {}
    # w3 stays silent past the grace (an older release): no lanes at all,
    assert fleet_sizes(["w1", "w3"], {"w1": 16}, silent, 200.0) == [16]
    sizes = fleet_sizes(["w1", "w3"], {"w1": 16}, silent, 200.0 + ANNOUNCE_GRACE)
    assert agreed_size(sizes) == 0
    # until it is no longer live (then it is forgotten).
    assert fleet_sizes(["w1"], {"w1": 16}, silent, 300.0) == [16]
    assert silent == {}


def test_heavy_keys_get_lanes_of_their_own_then_share_the_least_shared() -> None:
    table = LaneTable(size=3)
    assert [table.ask(k, 0.0) for k in "abc"] == [0, 1, 2]  # exclusive while lanes remain
    assert [table.ask(k, 0.0) for k in "de"] == [0, 1]  # then the fewest owners, lowest first
    assert table.ask("a", 1.0) == 0  # a key keeps its lane
    assert table.map().lanes == {"a": 0, "b": 1, "c": 2, "d": 0, "e": 1}


def test_no_lanes_are_given_while_the_fleet_has_none() -> None:
    table = LaneTable(size=0)
    assert table.ask("a", 0.0) is None
    assert table.map().lanes == {}
    assert table.version == 0


def test_a_key_leaves_only_once_its_lease_lapsed_and_its_lane_was_seen_empty_twice() -> None:
    table = LaneTable(size=2, lease=10.0, grace=3.0)
    table.ask("x", 0.0)
    table.ask("a", 0.0)
    version = table.version
    # Empty, but the lease runs: it stays.
    for t in (1.0, 2.0, 3.0):
        table.sweep(empty={1}, looked={0, 1}, now=t)
    assert table.lane_of("a") == 1
    # Lapsed, but its lane holds messages (a backlog): it stays, whatever the lease says.
    table.sweep(empty=set(), looked={0, 1}, now=20.0)
    assert table.lane_of("a") == 1
    # Lapsed and empty, but only once since the last look that found messages: it stays.
    table.sweep(empty={1}, looked={0, 1}, now=21.0)
    assert table.lane_of("a") == 1
    assert EMPTY_SWEEPS == 2
    table.sweep(empty={1}, looked={0, 1}, now=22.0)
    assert table.lane_of("a") is None  # producers route it to its shard again
    assert table.lane_of("x") == 0  # lapsed too, but its lane was never empty
    assert table.version == version + 1
    # For the grace its lane counts it, so a new key shares x's lane rather than take a's ...
    assert table.ask("y", 23.0) == 0
    # ... and after the grace the lane is free.
    table.sweep(empty=set(), looked=set(), now=25.0)
    assert table.ask("z", 25.0) == 1


def test_renewal_keeps_a_lane_and_a_leaving_key_that_turns_heavy_again_gets_its_lane_back() -> None:
    table = LaneTable(size=2, lease=10.0, grace=3.0)
    table.ask("a", 0.0)
    table.renew(["a", "unknown"], 9.0)  # a key without a lane is not given one by renewal
    for t in (10.0, 11.0):
        table.sweep(empty={0}, looked={0}, now=t)
    assert table.lane_of("a") == 0  # renewed at 9: its lease runs to 19
    assert table.lane_of("unknown") is None
    for t in (19.0, 20.0):
        table.sweep(empty={0}, looked={0}, now=t)
    assert table.lane_of("a") is None
    version = table.version
    assert table.ask("a", 20.5) == 0  # within the grace: the same lane, routed again
    assert table.lane_of("a") == 0
    assert table.version == version + 1


def test_fewer_lanes_agreed_sends_the_keys_beyond_them_back_to_their_shards() -> None:
    table = LaneTable(size=4)
    for k in "abcd":
        table.ask(k, 0.0)
    table.resize(2, 1.0)
    assert table.map().lanes == {"a": 0, "b": 1}
    assert table.ask("e", 1.0) == 0  # lanes 2 and 3 are no longer given
    table.resize(0, 2.0)
    assert table.ask("f", 2.0) is None


def test_a_look_once_a_second_never_misses_a_key_that_stays_heavy() -> None:
    # The router looks (to renew the lanes of its heavy keys) at its first publish a second
    # after its last look, just before counting it: the moment a key's window also restarts.
    heavy = HeavyKeys(threshold=16)
    missed, looked, next_look = 0, 0, 0.0
    for i in range(1000):  # 100 a second for 10 seconds
        now = i * 0.01
        if now >= next_look:
            next_look = now + 1.0
            if now >= 1.0:
                looked += 1
                missed += not heavy.over("A", now)
        heavy.publish("A", now)
    assert (looked, missed) == (9, 0)
    assert not heavy.over("A", 10.0 + 2.0)  # quiet for two windows: no longer heavy


def test_a_key_crowds_its_shard_when_the_shard_fills_a_window_and_the_key_holds_half() -> None:
    crowd = Crowding(shards=8, lanes=2)
    # Light keys fill shard 3's window: nobody crowds (no key holds half of it).
    for key in ("a", "b", "c", "d"):
        crowd.add(3, key)
    assert not any(crowd.crowds(3, k, window=4, now=0.0) for k in "abcd")
    # One key holding half a window of a full shard crowds it, once a second at most;
    for _ in range(2):
        crowd.add(5, "H")
    crowd.add(5, "x")
    assert not crowd.crowds(5, "H", window=4, now=0.0)  # 3 held: the shard is not full
    crowd.add(5, "H")
    assert crowd.crowds(5, "H", window=4, now=0.0)
    assert not crowd.crowds(5, "H", window=4, now=0.9)
    assert crowd.crowds(5, "H", window=4, now=1.0)
    # and not once its messages have gone (started or given back).
    for _ in range(3):
        crowd.remove(5, "H")
    assert not crowd.crowds(5, "H", window=4, now=5.0)
    assert crowd.held[5] == 1


def test_a_lane_never_crowds_and_is_backlogged_from_half_a_window() -> None:
    crowd = Crowding(shards=2, lanes=3)
    for _ in range(4):
        crowd.add(3, "H")  # lane 1 is slot 3
    assert not crowd.crowds(3, "H", window=4, now=0.0)  # already in a lane of its own
    assert crowd.backlogged(window=8) == [1]
    assert crowd.backlogged(window=9) == []
    crowd.remove(3, "H")
    crowd.remove(3, "H")
    assert crowd.backlogged(window=4) == [1]
    crowd.remove(3, "H")
    assert crowd.backlogged(window=4) == []
    crowd.remove(3, "H")
    crowd.remove(3, "H")  # never below zero
    assert crowd.held == [0] * 7  # 2 shards, 3 lanes, the stragglers of each shard
