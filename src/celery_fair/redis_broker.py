"""A Redis broker's own structures, for producers and workers alike.

Kombu's Redis transport keeps a queue as one list per priority step; ``redis_queue_lists``
names them, ``redis_broker_client`` opens the broker's server, and ``reroute`` moves a shard's
*stragglers* (messages of keys that have a lane now, core/lanes.py) to the consuming end of
their lanes with one call of move.lua. Two callers use it: a worker's intake, when its gate
receives a straggler (worker/intake), and a producer, the moment its publishes give a key its
lane (routing.Lanes): the key's messages it left in the key's shard then pop before the first
one it publishes to the lane, so its jobs start in the order it published them.

Each helper names the Kombu internal it relies on (checked against kombu 5.7.0, as
worker/internals.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import resources
from typing import Any

from .protocol import SHARD_HASH, base_name, lane_name

__all__ = [
    "BATCH",
    "MOVE_SCRIPT",
    "laned_pairs",
    "redis_broker_client",
    "redis_queue_lists",
    "reroute",
]

#: The most messages one script call looks at: about 1 ms of Redis's time to look at them
#: all, up to 8 ms to move them all.
BATCH = 500
MOVE_SCRIPT = (resources.files(__package__) / "move.lua").read_text()


def redis_queue_lists(channel: Any) -> Callable[[str], list[str]]:
    """For a Kombu Redis channel: a function from a queue's name to the Redis keys of its
    lists, one per priority step, highest priority first, with the transport's key prefix
    (``Channel._q_for_pri``, ``priority_steps``, ``global_keyprefix``)."""
    steps = list(channel.priority_steps)
    prefix = channel.global_keyprefix or ""
    name_of = channel._q_for_pri
    return lambda queue: [prefix + name_of(queue, step) for step in steps]


def redis_broker_client(channel: Any) -> Any:
    """A redis-py client of a Kombu Redis channel's server, on a connection pool of its own
    (``Channel._get_pool``: the broker URL's server, database, password, TLS, or the
    Sentinels' master), without Kombu's key prefixing."""
    import redis

    return redis.Redis(connection_pool=channel._get_pool(asynchronous=False))


def laned_pairs(lanes: Mapping[str, int], lane_count: int) -> list[Any]:
    """The keys of ``lanes`` (key -> lane) whose lane is below ``lane_count``, each followed
    by its lane: move.lua's last arguments.

    >>> laned_pairs({"a": 0, "b": 5}, 4)
    ['a', 0]
    """
    pairs: list[Any] = []
    for key, lane in lanes.items():
        if lane < lane_count:
            pairs += [key, lane]
    return pairs


def reroute(
    move: Any,
    lists: Callable[[str], list[str]],
    shard: str,
    lane_count: int,
    laned: list[Any],
    batch: int = BATCH,
) -> tuple[int, int]:
    """Move the stragglers among the oldest ``batch`` messages of ``shard`` (a shard's queue
    name): messages of the keys in ``laned`` (``laned_pairs``), to the consuming end of their
    lane, oldest nearest, so that they run before their key's newer messages and no longer
    stand between a light key's message and the workers; or, if stragglers moved from
    ``shard`` before still wait there next, to the far end, behind them (move.lua). ``move``:
    the script registered on the broker's client (``client.register_script(MOVE_SCRIPT)``).
    Returns (moved, looked at). One script call, atomic, O(looked at)."""
    if not laned:
        return 0, 0
    keys = list(lists(shard))
    steps = len(keys)
    base = base_name(shard)
    for j in range(lane_count):
        keys += lists(lane_name(base, j))
    head = [SHARD_HASH, 0, steps, batch, lane_count, 0, "shard", shard]
    moved, looked, _, _ = move(keys=keys, args=[*head, len(laned) // 2, *laned])
    return int(moved), int(looked)
