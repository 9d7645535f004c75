"""Each shard's own prefetch window on RabbitMQ: a burst takes no place a newcomer needs.

With one window for the whole channel (Celery's global ``basic.qos``), a full window's freed
places go to whichever queue the broker asks first, by lot, and the burst's queue is always
asking: a newcomer's shard may lose several draws in a row, and everything the window lets in
ahead of it crosses the socket first. RabbitMQ also counts unacknowledged messages per
consumer (``basic.qos`` with ``global=false``, applied to consumers created after it, within
the channel's window if that is set again after it). So each shard's consumer gets a window
of its own, what the worker can start plus one (``narrow``), and the burst's shard cannot fill
a place the newcomer's shard needs.

Three things need a deeper look than that, and get it:

- *Held work blocks the shard* (a pool process idles while every held job waits for a
  conflict or a cap): every shard's window opens by the gate's opening (window.Opening:
  doubled at each sweep that finds a process so idle, up to ``fair_max_held``), and closes
  again once the worker has gone ``SETTLE`` sweeps without idling so.
- *ETA and countdown tasks* stay unacknowledged in Celery's timer until they are due, and
  take their shard's places: each shard's window grows by what it has waiting so, in steps of
  ``CHUNK``.
- *Stragglers* (shard_turns.slot_of): messages of a key that waited in its shard from before
  the key got its lane. Held, they fill the shard's window while more of them, and the light
  keys behind them, wait in the shard; they are the key's oldest, so they stay held (its order
  kept) and the shard's window grows past them instead: by twice what it holds of them,
  rounded up to a power of two (at least ``CHUNK``), so a few changes read through any number.
  The gate asks for the change as soon as it holds one (``Gate._widen_soon``), not at its
  next sweep. Only while the worker holds messages from the key's lane, though
  (``LanesHere.read_past``): with none there, the stragglers are the key's whole backlog
  (published before the workers started, or found by rule 3), and read past they would all go
  to the first worker to them, to run alone while the others idle; they drain from the shard
  a window at a time by every worker instead.

RabbitMQ applies a consumer's window only when the consumer is created, so a change is made
by cancelling the shard's consumer and consuming again (internals.reconsume): unacked messages
stay with the channel and are acked as usual; the consumers of queues without a window of
their own are consumed again too (internals.consume_with_windows says why). That is a few
round trips per queue, made only when a window changes, from a sweep. What the worker can
start moves with its reserve's depth (reserve.py), which short jobs move up and down every
second: so the windows widen to it at once, and narrow only once it has stayed below them for
``NARROW_AFTER`` seconds (``ShardPrefetch.aim``). Following every move consumed all 24
queues of 8 shards and 16 lanes again 8 times a second, a fifth of the main process's time
on no-op tasks.
docs/operations.md#prefetch-qos says what users see.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery.utils.log import get_logger

from ..protocol import shard_index
from ..routing import is_part
from .internals import (
    applied_prefetch,
    channel_window_is_global,
    consume_with_windows,
    reconsume,
    scheduled_by_queue,
)
from .window import CHUNK

__all__ = ["NARROW_AFTER", "ShardPrefetch", "ShardWindows"]

logger = get_logger(__name__)

#: Seconds what the worker can start must stay below the shards' windows before they narrow.
NARROW_AFTER = 3.0


class ShardPrefetch:
    """The per-consumer windows of one connection's shard consumers. Pure: the gate tells it
    what it sees at each sweep, and applies the changes it asks for.

    >>> p = ShardPrefetch(narrow=3)
    >>> p.limit_for("celery.fair.2"), p.limit_for("celery")  # a base queue: no window of its own
    (3, 0)
    >>> p.observe(opening=16, eta={"celery.fair.2": 1})
    ['celery.fair.2']
    >>> p.limit_for("celery.fair.2")
    27
    """

    def __init__(self, narrow: int) -> None:
        self.narrow = max(1, narrow)
        self.opening = 0  # what every shard's window has past narrow (window.Opening)
        # _limits: the window each consumed shard was consumed with.
        self._limits: dict[str, int] = {}
        self._eta: dict[str, int] = {}
        self._stragglers: Mapping[int, int] = {}  # shard number -> stragglers held from it
        # While what the worker can start stays below ``narrow``: since when, and the most.
        self._below_since: float | None = None
        self._below = 0

    def aim(self, narrow: int, now: float) -> None:
        """What the worker can start plus one is ``narrow`` at ``now`` (a clock in seconds):
        the windows widen to it at once, and narrow to the most it has been since it fell
        below them only once it has stayed below for ``NARROW_AFTER`` seconds. O(1).

        >>> p = ShardPrefetch(narrow=3)
        >>> p.aim(11, now=0.0); p.aim(4, now=0.5); p.aim(6, now=2.0); p.narrow
        11
        >>> p.aim(5, now=3.5); p.narrow
        6
        """
        narrow = max(1, narrow)
        if narrow >= self.narrow:
            self.narrow, self._below_since = narrow, None
        elif self._below_since is None:
            self._below_since, self._below = now, narrow
        else:
            self._below = max(self._below, narrow)
            if now - self._below_since >= NARROW_AFTER:
                self.narrow, self._below_since = self._below, None

    def limit_for(self, queue: str) -> int:
        """The window to consume ``queue`` with now (0: none of its own, the channel's only),
        remembered as the one it has."""
        if not is_part(queue):  # a queue's own consumer, not a shard's or a lane's
            return 0
        limit = self._target(queue)
        self._limits[queue] = limit
        return limit

    def forget(self, queue: str) -> None:
        """``queue`` is no longer consumed (cancel_consumer, a new connection)."""
        self._limits.pop(queue, None)

    def observe(
        self,
        opening: int,
        eta: Mapping[str, int],
        stragglers: Mapping[int, int] | None = None,
    ) -> list[str]:
        """What the gate sees now: how far the windows open while held work blocks a process
        (window.Opening), how many ETA tasks wait in the timer per shard, and how many
        stragglers are held per shard number. Returns the shards to consume again, whose
        window should change. O(shards)."""
        self.opening = opening
        self._eta = {q: n for q, n in eta.items() if n > 0}
        self._stragglers = stragglers or {}
        return [q for q, limit in self._limits.items() if self._target(q) != limit]

    def _target(self, queue: str) -> int:
        base = self.narrow + self.opening
        waiting = self._eta.get(queue, 0)
        extra = -(-waiting // CHUNK) * CHUNK
        shard = shard_index(queue)
        held = self._stragglers.get(shard, 0) if shard is not None else 0
        if held:
            extra += max(CHUNK, 1 << (2 * held - 1).bit_length())
        return base + extra

    def info(self) -> dict[str, int]:
        """The window of each consumed shard."""
        return dict(self._limits)


class ShardWindows:
    """``ShardPrefetch`` applied to one connection's task consumer (AMQP, with Celery's
    channel-wide window: ``Tasks.qos_global``). Call ``follow`` from the event loop's thread,
    outside the gate's lock: consuming again dispatches the deliveries it meets."""

    def __init__(self, task_consumer: Any, narrow: int, channel_window: Callable[[], int]) -> None:
        self.prefetch = ShardPrefetch(narrow)
        self._consumer = task_consumer
        consume_with_windows(task_consumer, self.prefetch.limit_for, channel_window)

    @classmethod
    def install(cls, c: Any, narrow: int) -> ShardWindows | None:
        """Windows for ``c``'s shard consumers, where they work: RabbitMQ (``amqp``) with the
        channel-wide window Celery sets unless quorum queues make it per consumer, and an
        event loop to consume again from. Before the loop's first ``consume``."""
        if c.connection.transport.driver_type != "amqp" or c.hub is None:
            return None
        if c.task_consumer is None or not channel_window_is_global(c):
            return None
        return cls(c.task_consumer, narrow, lambda: applied_prefetch(c.qos))

    def follow(
        self,
        opening: int,
        narrow: int,
        stragglers: Mapping[int, int] | None,
        now: float,
    ) -> None:
        """Open, close or grow the windows as ``ShardPrefetch`` says, ``narrow`` being what
        the worker can start plus one at ``now`` (``ShardPrefetch.aim``). O(shards + ETA tasks
        waiting)."""
        self.prefetch.aim(narrow, now)
        scheduled = scheduled_by_queue(self._consumer)
        changed = self.prefetch.observe(opening, scheduled, stragglers)
        if not changed:
            return
        try:
            gone = reconsume(self._consumer, changed)
        except Exception as exc:  # the channel is gone: the consumer reconnects anew
            logger.warning("celery-fair: could not consume %s again (%r).", changed, exc)
            return
        for queue in gone:
            self.prefetch.forget(queue)
        logger.debug("celery-fair: shard windows now %s", self.prefetch.info())
