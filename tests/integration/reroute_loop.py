"""Reroutes one shard's stragglers to their lane in a loop, until killed: the intake's part
that ``test_intake.py`` SIGKILLs mid-move. Run with a run's environment (``Run.env``):

    python reroute_loop.py <shard> <key> <lane>
"""

from __future__ import annotations

import sys

from fairapp import app

from celery_fair.core.lanes import LaneMap
from celery_fair.redis_broker import redis_broker_client, redis_queue_lists
from celery_fair.routing import DEFAULT_SHARDS
from celery_fair.worker.intake import RedisIntake


class OneLane:
    """``routing.Lanes`` as the intake reads it: one key with a lane."""

    def __init__(self, key: str, lane: int) -> None:
        self.map = LaneMap(1, {key: lane}, 16)

    def current(self) -> LaneMap:
        return self.map


def main() -> None:
    shard, key, lane = sys.argv[1], sys.argv[2], int(sys.argv[3])
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        client = redis_broker_client(channel)
        intake = RedisIntake(
            client, redis_queue_lists(channel), DEFAULT_SHARDS, OneLane(key, lane), lane + 1
        )
        print("ready", flush=True)
        while True:
            intake.reroute(shard)


if __name__ == "__main__":
    main()
