"""The order of the Redis transport's reads: the shards the gate holds too few of first."""

from __future__ import annotations

from kombu.utils.scheduling import cycle_by_name

from celery_fair.protocol import shard_of
from celery_fair.worker.internals import order_redis_reads
from celery_fair.worker.shard_turns import ShardTurns, slot_of


class Channel:
    """What kombu.transport.redis.Channel has of its turns: Kombu's own cycle object."""

    def __init__(self, queues):
        self._queue_cycle = cycle_by_name("round_robin")()
        self._queue_cycle.update(queues)


def test_a_shard_held_a_window_of_goes_last_and_comes_back_when_one_starts():
    turns = ShardTurns(shards=8, window=lambda: 3)
    queues = ["q.fair.0", "q.fair.5", "q", "q.fair.7"]
    for _ in range(3):
        turns.add(5)
    assert turns.order(queues) == ["q.fair.0", "q.fair.7", "q", "q.fair.5"]
    turns.remove(5)
    assert turns.order(queues) == ["q.fair.0", "q.fair.7", "q.fair.5", "q"]
    turns.remove(0)  # never below zero
    assert turns.held[0] == 0


def test_the_queues_held_none_of_come_first_each_group_in_its_turn():
    # Given a gate that holds two of lane 0's key, one of lane 1's and none of lane 2's (the
    # core started its key as fast as it came: it is behind its share),
    turns = ShardTurns(shards=2, window=lambda: 4, lanes=3)
    for slot, n in ((2, 2), (3, 1)):
        for _ in range(n):
            turns.add(slot)
    lanes = ["q.fair.lane.0", "q.fair.lane.1", "q.fair.lane.2"]
    # then lane 2 is read first, whatever the transport's turn, the others in their turns,
    assert turns.order(lanes) == ["q.fair.lane.2", "q.fair.lane.0", "q.fair.lane.1"]
    assert turns.order(lanes[::-1]) == ["q.fair.lane.2", "q.fair.lane.1", "q.fair.lane.0"]
    # and once held some of, it takes its turn again.
    turns.add(4)
    assert turns.order(lanes) == lanes


def test_the_window_is_read_at_each_fetch():
    window = [3]
    turns = ShardTurns(shards=2, window=lambda: window[0])
    turns.add(1)
    turns.add(0)
    turns.add(0)
    assert turns.order(["a.fair.0", "a.fair.1"]) == ["a.fair.0", "a.fair.1"]
    window[0] = 2
    assert turns.order(["a.fair.0", "a.fair.1"]) == ["a.fair.1", "a.fair.0"]


def test_kombus_turns_go_through_the_order_and_still_rotate():
    channel = Channel(["q.fair.0", "q.fair.1", "q.fair.2"])
    turns = ShardTurns(shards=3, window=lambda: 1)
    assert order_redis_reads(channel, turns.order)
    turns.add(0)
    assert channel._queue_cycle.consume(3) == ["q.fair.1", "q.fair.2", "q.fair.0"]
    channel._queue_cycle.rotate("q.fair.1")  # what _brpop_read does after a read
    assert channel._queue_cycle.consume(3) == ["q.fair.2", "q.fair.1", "q.fair.0"]
    # installed again (a new connection reuses the channel object): one wrapper, new order
    assert order_redis_reads(channel, lambda queues: list(reversed(queues)))
    assert channel._queue_cycle.consume(3) == ["q.fair.1", "q.fair.2", "q.fair.0"]
    assert not order_redis_reads(object(), turns.order)  # not a Redis channel


def test_a_lane_counts_in_its_own_slot_and_goes_last_once_held_a_window_of() -> None:
    turns = ShardTurns(shards=2, window=lambda: 2, lanes=3)
    # A message counts in the queue it came from: the lane or shard its routing key names,
    assert slot_of("q.fair.lane.1", "A", None, 2, 3) == 3
    assert slot_of("q.fair.1", "A", None, 2, 3) == 1
    # a message from a shard whose key has a lane now is a straggler, which orders no queue,
    assert slot_of("q.fair.1", "A", 0, 2, 3) == 2 + 3 + 1
    turns.add(6)
    assert turns.held[6] == 1
    assert turns.order(["q.fair.0", "q.fair.1"]) == ["q.fair.0", "q.fair.1"]
    turns.remove(6)
    # else (moved by the intake, which keeps the queue's routing key) its key's lane now,
    assert slot_of("q", "A", 1, 2, 3) == 3
    # else its key's shard; a lane beyond those consumed is not one.
    assert slot_of("q.fair.lane.3", "A", None, 2, 3) == shard_of("A", 2)
    assert slot_of(None, "A", None, 2, 3) == shard_of("A", 2)
    queues = ["q.fair.lane.1", "q.fair.0", "q.fair.1", "q"]
    turns.add(3)
    assert turns.lanes_held() == 1
    assert turns.order(queues) == ["q.fair.0", "q.fair.1", "q.fair.lane.1", "q"]
    turns.add(3)  # the heavy key's lane held a window of: its light neighbours come first
    assert turns.order(queues) == ["q.fair.0", "q.fair.1", "q", "q.fair.lane.1"]
    turns.remove(3)
    turns.remove(3)
    assert turns.lanes_held() == 0


def test_lanes_not_held_a_window_of_are_read_the_furthest_behind_first() -> None:
    # shards 0-1, lanes 0-3 (slots 2-5); lane 3's key catches up (cost 1), the others at 9,
    # shards (light keys) at 0: held none of first, then held some, each the least cost first
    turns = ShardTurns(shards=2, window=lambda: 3, lanes=4)
    cost = {0: 0.0, 1: 0.0, 2: 9.0, 3: 9.0, 4: 9.0, 5: 1.0}
    turns.behind = cost.__getitem__
    turns.add(0)
    turns.add(3)  # lane 1: held one
    turns.add(5)  # lane 3: held one
    for _ in range(3):
        turns.add(4)  # lane 2: a window
    queues = ["q.fair.lane.0", "q.fair.lane.1", "q.fair.lane.2", "q.fair.lane.3", "q.fair.0",
              "q.fair.1", "q"]  # fmt: skip
    assert turns.order(queues) == [
        "q.fair.1",  # held none, cost 0
        "q.fair.lane.0",  # held none, 9
        "q.fair.0",  # held one, 0
        "q.fair.lane.3",  # held one, 1: the key catching up before lane 1's
        "q.fair.lane.1",
        "q",  # no shard or lane: after them
        "q.fair.lane.2",  # a window held: last
    ]


def test_with_two_level_keys_cost_decides_before_whether_a_queue_is_held_none_of():
    # A heavy tenant's shard held none of, and a lane of a tenant far behind held some of:
    # flat keys read the shard first; with tenants, the lane.
    turns = ShardTurns(shards=2, window=lambda: 4, lanes=1)
    turns.add(2)  # one message of the lane's key is held
    cost = {0: 9.0, 1: 9.0, 2: 1.0}
    turns.behind = cost.__getitem__
    queues = ["q.fair.0", "q.fair.lane.0"]
    assert turns.order(queues) == ["q.fair.0", "q.fair.lane.0"]
    turns.behind_first = True
    assert turns.order(queues) == ["q.fair.lane.0", "q.fair.0"]
    cost[2] = 9.0  # a tie: the queue held none of first, as with flat keys
    assert turns.order(queues) == ["q.fair.0", "q.fair.lane.0"]
