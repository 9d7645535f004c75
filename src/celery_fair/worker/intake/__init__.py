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

On Redis the same script also *reroutes*: a key that got its lane (core/lanes.py) may have
left messages in its shard from before, stragglers, and a light key's message behind them
waits for them all. When the gate receives one, it tells the intake (``reroute_soon``), which
moves every straggler among the shard's oldest ``BATCH`` messages to the consuming end of its
key's lane, in order, so they run before the key's newer messages there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from celery.utils.log import get_logger

from ...observe import Observer
from ...protocol import SHARD_HASH, base_name, lane_name, shard_name
from ...redis_broker import BATCH, MOVE_SCRIPT, laned_pairs, reroute

__all__ = ["BATCH", "Intake", "IntakeThread", "RedisIntake", "plain_consumers"]

logger = get_logger(__name__)

#: Seconds between two looks for workers that consume a queue without its shards, and before
#: the first.
CHECK_EVERY = 300.0
FIRST_CHECK = 5.0
#: Seconds the thread waits, once told of stragglers, for more before it reroutes them all: at
#: most one reroute of a shard per gap, however many stragglers the gate receives.
REROUTE_GAP = 0.01


class RedisIntake:
    """Moves fair messages from a queue into their shards, or their lanes, on a Redis broker.

    Args:
        client: A redis-py client of the broker's Redis (no key prefix of its own).
        lists: The Redis keys of a queue's lists, one per priority step, highest priority
            first, with Kombu's key prefix (``redis_broker.redis_queue_lists``).
        shards: How many shards each queue has (``fair_shards``).
        lanes: The app's lanes (``routing.Lanes``) and how many of each queue's this worker
            consumes; a key with a lane moves to it, and a key without one that has more than
            the lane threshold among the messages one call looks at asks for one first.
    """

    def __init__(
        self,
        client: Any,
        lists: Callable[[str], list[str]],
        shards: int,
        lanes: Any = None,
        lane_count: int = 0,
    ) -> None:
        self.client = client
        self.lists = lists
        self.shards = shards
        self.lanes = lanes if lane_count > 0 else None
        self.lane_count = lane_count if lanes is not None else 0
        self._move = client.register_script(MOVE_SCRIPT)
        self.moved = 0  # messages moved by this intake

    def move(self, queue: str, batch: int = BATCH) -> tuple[int, int]:
        """Move what is keyed among the oldest ``batch`` messages of ``queue``; returns
        (moved, looked at). One script call, O(looked at) on Redis; one more, and a lane asked
        for, when a key turns heavy among them. An empty queue costs one ``EXISTS`` of its
        lists instead (Redis deletes an empty list): the script names every shard and lane,
        and the queue is empty at nearly every interval on a fleet whose producers use
        ``fair_router``."""
        keys = list(self.lists(queue))
        if not self.client.exists(*keys):
            return 0, 0
        steps = len(keys)
        for i in range(self.shards):
            keys += self.lists(shard_name(queue, i))
        for j in range(self.lane_count):
            keys += self.lists(lane_name(queue, j))
        lanes = self.lanes
        threshold = lanes.heavy.threshold if lanes is not None else 0
        asked: set[str] = set()
        for attempt in range(3):  # move; or ask for lanes, and move
            if attempt == 2:
                threshold = 0  # (lanes given but not in the map yet: to their shards)
            laned = self._laned()
            head = [SHARD_HASH, self.shards, steps, batch, self.lane_count, threshold]
            head += ["queue", ""]
            reply = self._move(keys=keys, args=[*head, len(laned) // 2, *laned])
            moved, looked, heavy, counted = reply
            if not heavy or lanes is None:
                break
            asked.update(_text(k) for k in heavy)
            given = [lanes.ask(_text(k)) for k in heavy]
            if not any(lane is not None and lane < self.lane_count for lane in given):
                threshold = 0  # no lane to be had: they go to their shards
        if lanes is not None and counted:
            # Keys moved to their shards count per second, as a producer's publishes do: one
            # that passes the threshold over several calls asks for its lane for the next.
            now = time.monotonic()
            for i in range(0, len(counted), 2):
                key = _text(counted[i])
                if lanes.heavy.publish(key, now, int(counted[i + 1])) and key not in asked:
                    lanes.ask(key)
        self.moved += int(moved)
        return int(moved), int(looked)

    def _laned(self) -> list[Any]:
        """The keys with a lane this worker consumes, each followed by its lane."""
        if self.lanes is None:
            return []
        return laned_pairs(self.lanes.current().lanes, self.lane_count)

    def reroute(self, shard: str, batch: int = BATCH) -> tuple[int, int]:
        """Move the stragglers among the oldest ``batch`` messages of ``shard`` (a shard's
        queue name) to their lanes (``redis_broker.reroute``). Returns (moved, looked at)."""
        return reroute(self._move, self.lists, shard, self.lane_count, self._laned(), batch)

    def close(self) -> None:
        self.client.close()

    def drain(self, queues: Iterable[str], batch: int = BATCH) -> int:
        """Move until a call finds a full batch no more: returns how many moved."""
        return drain(self.move, queues, batch)

    def drain_shards(self, shards: Iterable[str], batch: int = BATCH) -> int:
        """Reroute each of ``shards`` until a call finds a full batch no more: returns how
        many moved."""
        return drain(self.reroute, shards, batch)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def drain(move: Callable[[str, int], tuple[int, int]], queues: Iterable[str], batch: int) -> int:
    """Call ``move(queue, batch)`` on each queue until a call moves nothing or looks at less
    than a full batch; returns how many moved."""
    total = 0
    for queue in queues:
        while True:
            moved, looked = move(queue, batch)
            total += moved
            if not moved or looked < batch:
                break
    return total


class Intake(Protocol):
    """What ``IntakeThread`` runs: ``RedisIntake`` or ``amqp.AmqpIntake`` (which has no
    ``drain_shards``: on RabbitMQ the gate reads past stragglers, consumer_prefetch.py)."""

    def drain(self, queues: Iterable[str], batch: int = BATCH) -> int: ...

    def close(self) -> None: ...


def plain_consumers(
    app: Any, queues: Iterable[str], timeout: float = 1.0, lanes: bool = False
) -> dict[tuple[str, str], list[str]]:
    """The workers that consume one of ``queues`` without the parts fair workers read, from
    ``inspect active_queues``, by (queue, part): ``"shards"`` for those that consume the queue
    but not its shards (plain Celery workers, or fair workers with ``fair_shards = 1``); with
    ``lanes``, ``"lanes"`` for those that consume its shards but not its lanes (fair workers
    without a shared store, or with ``fair_lanes = 0``).

    It asks over a connection of its own, never one of the app's pool: the prefork pool closes
    every pooled connection in each process it starts, and closing a Redis connection whose
    reply read is in flight here waits on a socket the parent reads: the new process hung
    before it said it was up, and was killed ``worker_proc_alive_timeout`` later
    (docs/failure-modes.md)."""
    with app.connection_for_read() as connection:
        replies = app.control.inspect(timeout=timeout, connection=connection).active_queues()
    replies = replies or {}
    found: dict[tuple[str, str], list[str]] = {}
    for queue in queues:
        shard, lane = shard_name(queue, 0), lane_name(queue, 0)
        for node, consumed in sorted(replies.items()):
            names = {q.get("name") for q in consumed or ()}
            if queue in names and shard not in names:
                found.setdefault((queue, "shards"), []).append(node)
            elif lanes and shard in names and lane not in names:
                found.setdefault((queue, "lanes"), []).append(node)
    return found


class IntakeThread(threading.Thread):
    """Runs an intake for the queues a worker consumes, until stopped.

    It drains every queue, then looks again after ``interval`` seconds (at once after a call
    that moved a full batch); told of stragglers, it reroutes them at once and drains the
    queues only when their interval is up (each drain names every shard and lane of a
    queue). A broker error is logged once per outage and retried. With ``app``, every
    ``CHECK_EVERY`` seconds (the first time ``first_check`` seconds after it starts) a thread
    of its own looks for workers that consume the same queues without their shards (and,
    with ``lanes``, this worker consuming lanes, without their lanes), and warns about each
    once: that look waits up to a second for the workers' replies, and on the intake's
    thread a message published meanwhile would wait for it too.
    """

    def __init__(
        self,
        intake: Intake,
        queues: Callable[[], list[str]],
        interval: float,
        app: Any = None,
        observer: Observer | None = None,
        lanes: bool = False,
        first_check: float = FIRST_CHECK,
    ) -> None:
        super().__init__(name="celery-fair intake", daemon=True)
        self.intake = intake
        self.observer = observer if observer is not None else Observer()
        self.queues = queues
        self.interval = interval
        self.app = app
        self.lanes = lanes
        self._first_check = first_check
        self._checks: threading.Thread | None = None
        self._warned: dict[tuple[str, str], list[str]] = {}
        self._halt = threading.Event()
        self._wake = threading.Event()  # set by stop and by reroute_soon
        self._stragglers: set[str] = set()  # shards to reroute at the next turn
        self._reroutes = hasattr(intake, "drain_shards")  # Redis's intake; RabbitMQ's reads past
        self._failing = False

    def run(self) -> None:
        if self.app is not None:
            self._checks = threading.Thread(
                target=self._check_every, name="celery-fair consumer check", daemon=True
            )
            self._checks.start()
        try:
            self._run()
        finally:
            self.intake.close()

    def reroute_soon(self, shard: str) -> bool:
        """Stragglers wait in ``shard`` (a shard's queue name): move them to their lanes at the
        thread's next turn, at once. Called by the gate on the worker's event loop; O(1).
        ``False`` if this intake cannot (RabbitMQ's, whose gate reads past them)."""
        if not self._reroutes:
            return False
        self._stragglers.add(shard)  # a set's add is atomic: no lock needed
        self._wake.set()
        return True

    def _run(self) -> None:
        drain_at = 0.0  # (monotonic) when the queues are drained next: each interval
        while not self._halt.is_set():
            try:
                self._reroute()
                now = time.monotonic()
                if now >= drain_at:  # not at a wake for stragglers
                    drain_at = now + self.interval
                    self._drain()
            except Exception as exc:  # a Redis outage or failover: keep trying
                if not self._failing:
                    logger.warning("celery-fair intake: cannot move messages (%s); retrying.", exc)
                self._failing = True
            else:
                if self._failing:
                    logger.info("celery-fair intake: moving messages again.")
                self._failing = False
            if self._wake.wait(max(0.0, drain_at - time.monotonic())):
                self._halt.wait(REROUTE_GAP)  # stragglers: let the next few come too
            self._wake.clear()

    def _reroute(self) -> None:
        while self._stragglers:
            shard = self._stragglers.pop()
            moved = self.intake.drain_shards([shard])  # type: ignore[attr-defined]
            if moved:
                self.observer.rerouted(base_name(shard), moved)

    def _drain(self) -> None:
        for queue in self.queues():
            moved = self.intake.drain([queue])
            if moved:
                self.observer.moved(queue, moved)

    def _check_every(self) -> None:
        wait = self._first_check
        while not self._halt.wait(wait):
            self._check_consumers()
            wait = CHECK_EVERY

    def _check_consumers(self) -> None:
        try:
            found = plain_consumers(self.app, self.queues(), lanes=self.lanes)
        except Exception as exc:  # remote control off, or the broker away: try next time
            logger.debug("celery-fair: could not list the workers' queues (%s).", exc)
            return
        for (queue, part), nodes in sorted(found.items()):
            if self._warned.get((queue, part)) == nodes:
                continue
            if part == "lanes":
                logger.warning(
                    "celery-fair: %s consume(s) the shards of queue %r but not its lanes (a "
                    "fair worker without the shared store, or with fair_lanes = 0?): it runs no "
                    "job of a key that has a lane, and the workers that read the lanes run "
                    "them all (docs/operations.md#lanes-heavy-keys-out-of-the-way).",
                    ", ".join(nodes),
                    queue,
                )
            else:
                logger.warning(
                    "celery-fair: %s consume(s) queue %r but not its shards (a plain Celery "
                    "worker?): it takes that queue's messages without fairness, and jobs "
                    "published to the shards wait for fair workers "
                    "(docs/operations.md#mixed-fleets-and-upgrades).",
                    ", ".join(nodes),
                    queue,
                )
        self._warned = found

    def stop(self, timeout: float = 5.0) -> None:
        self._halt.set()
        self._wake.set()
        deadline = time.monotonic() + timeout
        if self.is_alive():
            self.join(timeout)
        if self._checks is not None and self._checks.is_alive():
            self._checks.join(max(0.0, deadline - time.monotonic()))
