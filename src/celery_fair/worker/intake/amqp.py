"""The intake on RabbitMQ: a consumer that republishes keyed fair messages into their shards.

A queue on RabbitMQ cannot be read past its head without taking the messages, so a pass takes
the oldest messages that are ready (up to a batch), publishes each with a fairness key to its
shard with publisher confirms (waited for as a batch) and acknowledges it only once the broker
has confirmed the copy,
and gives the others back with ``basic.reject(requeue=True)``, which puts them back in their
place. Its consumer has priority -1: RabbitMQ gives it messages only while every worker's
consumer of the queue is full, which is when a backlog builds up in front of newcomers; while
the workers have room they take the queue's messages themselves.

At least once: a worker that dies after a copy is confirmed and before the original is
acknowledged leaves both; the gate and the shared store drop a copy of a job they hold, run
or have just finished (docs/operations.md#task-ids-celery-reuses).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from amqp.exceptions import NotFound
from celery.utils.log import get_logger
from kombu.entity import Queue
from kombu.messaging import Consumer, Producer

from ...routing import Shards
from ..headers import FAIRNESS_KEY, header_text
from ..returns import publish_copy
from . import BATCH, drain

__all__ = ["AmqpIntake"]

logger = get_logger(__name__)

#: How long a pass waits for the next delivery before it works on what it has.
DELIVERY_WAIT = 0.02
#: The consumer priority of the intake: below the workers' (0).
PRIORITY = -1


class _Confirms:
    """Publisher confirms for one channel, waited for as a batch (py-amqp's ``confirm_publish``
    waits for each publish alone: one round trip per message). The broker confirms copies
    bound for different queues out of order: ``basic.ack`` with ``multiple`` covers every tag
    up to its own, and one without covers just its own."""

    def __init__(self, channel: Any) -> None:
        self.upto = 0  # every tag up to this one is confirmed
        self.singles: set[int] = set()  # tags above ``upto`` confirmed one by one
        self.nacked = False
        channel.confirm_select()
        channel.events["basic_ack"].add(self._ack)
        channel.events["basic_nack"].add(self._nack)

    def _ack(self, delivery_tag: int, multiple: bool) -> None:
        if multiple:
            self.upto = max(self.upto, delivery_tag)
        else:
            self.singles.add(delivery_tag)
        while self.upto + 1 in self.singles:
            self.upto += 1
            self.singles.discard(self.upto)

    def _nack(self, delivery_tag: int, multiple: bool) -> None:
        self.nacked = True

    def wait(self, conn: Any, published: int, timeout: float = 30.0) -> None:
        """Until the broker confirmed ``published`` messages. Raises if it refused one, or
        took longer than ``timeout`` (the originals then stay unacknowledged: nothing lost)."""
        deadline = time.monotonic() + timeout
        while self.upto < published and not self.nacked:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the broker confirmed {self.upto} of {published} copies")
            conn.drain_events(timeout=left)
        if self.nacked:
            raise RuntimeError("the broker refused a copy (basic.nack)")


class AmqpIntake:
    """Moves keyed fair messages from a queue into their shards on RabbitMQ.

    Args:
        app: The worker's Celery app (its broker, and its shard queues).
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.shards = Shards.of(app)
        self._connection: Any = None
        self.moved = 0  # messages moved by this intake

    def move(self, queue: str, batch: int = BATCH) -> tuple[int, int]:
        """One pass over the oldest ready messages of ``queue`` (at most ``batch``); returns
        (moved, looked at). About five round trips, however many it moves."""
        conn = self._connect()
        channel = conn.channel()
        try:
            try:
                ready = channel.queue_declare(queue, passive=True).message_count
            except NotFound:
                return 0, 0
            if not ready:
                return 0, 0
            got = self._take(conn, channel, queue, min(batch, ready))
            moved = self._move(conn, channel, queue, got)
        finally:
            channel.close()
        self.moved += moved
        return moved, len(got)

    def _take(self, conn: Any, channel: Any, queue: str, wanted: int) -> list[Any]:
        got: list[Any] = []
        channel.basic_qos(0, wanted, False)
        source = Queue(queue, no_declare=True, consumer_arguments={"x-priority": PRIORITY})
        consumer = Consumer(channel, queues=[source], on_message=got.append)
        consumer.consume()
        try:
            while len(got) < wanted:
                try:
                    conn.drain_events(timeout=DELIVERY_WAIT)
                except TimeoutError:
                    break
        finally:
            consumer.cancel()  # deliveries that beat the cancel still land in ``got``
        return got

    def _move(self, conn: Any, channel: Any, queue: str, messages: list[Any]) -> int:
        keyed = []
        for message in messages:
            # A key that is not Unicode text has no shard: it stays, and the gate repairs it.
            key = header_text((message.headers or {}).get(FAIRNESS_KEY))
            if key:
                keyed.append((message, key))
            else:
                message.reject(requeue=True)  # back in its place
        if not keyed:
            return 0
        confirms = _Confirms(channel)
        producer = Producer(channel)
        for message, key in keyed:
            shard = self.shards.queue_for(queue, key)
            # The body as it came (compressed, if it was: its headers say so).
            publish_copy(producer, message, message.headers, "", shard.name, declare=[shard])
        confirms.wait(conn, len(keyed))  # every copy is the broker's before any original goes
        for message, _ in keyed:
            message.ack()
        return len(keyed)

    def drain(self, queues: Iterable[str], batch: int = BATCH) -> int:
        """Pass after pass over each queue until one moves nothing: returns how many moved."""
        try:
            return drain(self.move, queues, batch)
        except Exception:
            self.close()  # a fresh connection next time
            raise

    def _connect(self) -> Any:
        if self._connection is None:
            self._connection = self.app.connection_for_write()
            self._connection.ensure_connection(max_retries=1)
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.release()
            finally:
                self._connection = None
