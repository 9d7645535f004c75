"""The intake: fair messages that producers published to a queue move into their shards.

A producer that knows nothing of celery-fair publishes a fair job (``send_task(...,
headers=fair_headers(...))`` without ``fair_router``) to the queue itself, behind everything
published there before it. The intake takes such messages out of the queue and into the shard
of their fairness key (routing.py), where the fair workers find them in turns with every other
shard; the queue's backlog then drains at the intake's speed, not the pool's.

On RabbitMQ, a low-priority consumer republishes them with publisher confirms (amqp.py). On
a Redis broker one script call (move.lua) moves a batch, atomically and losslessly: each
message is read where it lies and pushed, unchanged, to the head of its shard's list of the
same priority step; what is not a keyed fair job stays, in its order. Every fair worker runs an
intake for the queues it consumes (``IntakeThread``); their calls never overlap on Redis, so
two intakes never move one message twice. A message keeps its routing key (the queue's): if
Kombu restores it unacknowledged (a worker died), it goes back to the queue, and the intake
moves it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from importlib import resources
from typing import Any, Protocol

from celery.utils.log import get_logger

from ..routing import SHARD_HASH, shard_name

__all__ = ["BATCH", "Intake", "IntakeThread", "RedisIntake"]

logger = get_logger(__name__)

#: The most messages one script call looks at: about 1 ms of Redis's time to look at them
#: all, up to 8 ms to move them all.
BATCH = 500
_SCRIPT = (resources.files(__package__) / "move.lua").read_text()


class RedisIntake:
    """Moves fair messages from a queue into their shards on a Redis broker.

    Args:
        client: A redis-py client of the broker's Redis (no key prefix of its own).
        lists: The Redis keys of a queue's lists, one per priority step, highest priority
            first, with Kombu's key prefix (``internals.redis_queue_lists``).
        shards: How many shards each queue has (``fair_shards``).
    """

    def __init__(self, client: Any, lists: Callable[[str], list[str]], shards: int) -> None:
        self.client = client
        self.lists = lists
        self.shards = shards
        self._move = client.register_script(_SCRIPT)
        self.moved = 0  # messages moved by this intake

    def move(self, queue: str, batch: int = BATCH) -> tuple[int, int]:
        """One script call: move what is keyed among the oldest ``batch`` messages of
        ``queue``; returns (moved, looked at). One round trip; O(looked at) on Redis."""
        keys = list(self.lists(queue))
        steps = len(keys)
        for i in range(self.shards):
            keys += self.lists(shard_name(queue, i))
        moved, looked = self._move(keys=keys, args=[SHARD_HASH, self.shards, steps, batch])
        self.moved += int(moved)
        return int(moved), int(looked)

    def close(self) -> None:
        self.client.close()

    def drain(self, queues: Iterable[str], batch: int = BATCH) -> int:
        """Move until a call finds a full batch no more: returns how many moved."""
        total = 0
        for queue in queues:
            while True:
                moved, looked = self.move(queue, batch)
                total += moved
                if not moved or looked < batch:
                    break
        return total


class Intake(Protocol):
    """What ``IntakeThread`` runs: ``RedisIntake`` or ``amqp.AmqpIntake``."""

    def drain(self, queues: Iterable[str], batch: int = BATCH) -> int: ...

    def close(self) -> None: ...


class IntakeThread(threading.Thread):
    """Runs an intake for the queues a worker consumes, until stopped.

    It drains every queue, then looks again after ``interval`` seconds (at once after a call
    that moved a full batch). A Redis error is logged once per outage and retried.
    """

    def __init__(self, intake: Intake, queues: Callable[[], list[str]], interval: float) -> None:
        super().__init__(name="celery-fair intake", daemon=True)
        self.intake = intake
        self.queues = queues
        self.interval = interval
        self._halt = threading.Event()
        self._failing = False

    def run(self) -> None:
        try:
            self._run()
        finally:
            self.intake.close()

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                self.intake.drain(self.queues())
            except Exception as exc:  # a Redis outage or failover: keep trying
                if not self._failing:
                    logger.warning("celery-fair intake: cannot move messages (%s); retrying.", exc)
                self._failing = True
            else:
                if self._failing:
                    logger.info("celery-fair intake: moving messages again.")
                self._failing = False
            self._halt.wait(self.interval)

    def stop(self, timeout: float = 5.0) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout)
