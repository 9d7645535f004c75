"""The prefetch window: how much the gate raises Celery's, and when it gives the raise back.

A held message is unacknowledged and so takes a place in the consumer's prefetch window; one
client's burst would fill it and hide every other client's messages. While fair work is inside
the worker (held or running) the gate keeps the window ahead of what it holds, with one place
more (the lookahead: ``acks_late`` jobs keep theirs while they run). With none inside, the
window is Celery's own. docs/operations.md#prefetch-qos says what users see.

The window moves in chunks (at least ``CHUNK``, grown by half, shrunk only when far too big),
and the raise is given back only after a whole sweep interval without fair work: on RabbitMQ
every change is a ``basic.qos`` round trip.

How far it may grow is the gate's ``limit``: ``fair_max_held`` without shards, where a
newcomer's message lies behind the whole burst and the gate must take the burst in to see it.
With shards a newcomer lies in a shard of its own, which the consumer reads in turn with the
burst's, so the gate needs in hand only what it can start plus one look at each shard; taking
more would only let the first worker to a burst hoard it while the others idle at its end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .shard_turns import ShardTurns

__all__ = ["CHUNK", "SETTLE", "Opening", "PrefetchWindow", "Windows", "blocked_idle"]

#: The smallest step the window moves by.
CHUNK = 8

#: Sweeps in a row without a blocked, idle process before an opening closes again.
SETTLE = 2


class PrefetchWindow:
    """What the gate has added to one connection's prefetch window (Kombu's ``QoS``).

    ``qos`` returns the consumer's current ``QoS`` (a new one per connection), or ``None``
    before there is one. Changes go through ``increment_eventually``/``decrement_eventually``;
    Celery's event loop applies them.
    """

    def __init__(self, qos: Callable[[], Any], max_held: int) -> None:
        self._qos = qos
        self._cap = max_held + 1
        # raised: how much this window has added on this connection. While fair work is
        # inside, held + 1 <= raised <= max(CHUNK, 2 * (held + 1) + 16), capped at
        # limit + 1; once none has been inside for a whole sweep interval, 0.
        self.raised = 0
        self._fair_since_sweep = False  # fair work came in since the last sweep

    def follow(self, held: int, fair_inside: bool, limit: int | None = None) -> None:
        """Keep the window ahead of ``held`` messages, if fair work is inside, holding at most
        ``limit`` (at most ``max_held``; by default ``max_held``). O(1)."""
        qos = self._qos()
        if qos is None or not fair_inside:
            return
        self._fair_since_sweep = True
        cap = self._cap if limit is None else min(self._cap, limit + 1)
        need = min(held + 1, cap)
        raised = self.raised
        if need > raised:
            target = min(cap, max(CHUNK, need + need // 2))
            qos.increment_eventually(target - raised)
        elif raised > cap or raised > max(CHUNK, 2 * need + 16):
            target = min(cap, max(CHUNK, need + need // 2))
            qos.decrement_eventually(raised - target)
        else:
            return
        self.raised = target

    def sweep(self, fair_inside: bool) -> None:
        """Periodic: give the raise back if no fair work has been inside since the last sweep."""
        idle = not (fair_inside or self._fair_since_sweep)
        self._fair_since_sweep = False
        qos = self._qos()
        if idle and self.raised and qos is not None:
            qos.decrement_eventually(self.raised)
            self.raised = 0

    def reset(self) -> None:
        """A new connection, whose QoS starts from Celery's own value."""
        self.raised = 0


def blocked_idle(
    *, starved: bool, running: int, capacity: int, lookahead: int, deciding: bool
) -> bool:
    """A pool process idles that no held job can take: they all wait for conflicts or caps
    (``starved``). An empty place in the reserve is no reason: a cap may keep it empty while
    every process is busy. Nor is a process that a decision due or in flight may fill
    (``deciding``): ``starved`` is the last decision's finding, and a job that ended since, or
    a job that ended elsewhere, may have made a held job admissible. O(1).

    >>> blocked_idle(starved=True, running=1, capacity=3, lookahead=1, deciding=False)
    True
    >>> blocked_idle(starved=True, running=2, capacity=3, lookahead=1, deciding=False)
    False
    >>> blocked_idle(starved=True, running=1, capacity=3, lookahead=1, deciding=True)
    False
    """
    return starved and running < capacity - lookahead and not deciding


class Opening:
    """How far the windows open past what the worker can start while a pool process idles
    that no held job can take (``blocked_idle``): a job that can run may lie deeper.

    Each sweep that finds a process so idle doubles the opening (from ``CHUNK``, at most
    ``most``), and ``SETTLE`` sweeps in a row without one close it. Opening all the way at
    once would cost more than the job found: on a fleet, a process idles so at moments when
    a fleet-wide cap is full (a tier's, counting reserved jobs, against more places than it
    allows), and a worker that took in ``fair_max_held`` messages then would run them alone at
    the burst's end while the others idled. Doubling reads past any number of blocked jobs in
    a few sweeps and takes in at most twice what the search needed. O(1).

    >>> o = Opening(most=100)
    >>> [(o.observe(True), o.extra)[1] for _ in range(6)]
    [8, 16, 32, 64, 100, 100]
    >>> [(o.observe(False), o.extra)[1] for _ in range(SETTLE)]
    [100, 0]
    """

    def __init__(self, most: int) -> None:
        self.most = most
        self.extra = 0  # messages past what the worker can start, per window
        self._calm = 0  # sweeps in a row without a blocked, idle process

    def observe(self, blocked_idle: bool) -> None:
        """One sweep: whether a pool process idles that no held job can take."""
        if blocked_idle:
            self._calm = 0
            self.extra = min(self.most, max(CHUNK, 2 * self.extra))
        elif self.extra:
            self._calm += 1
            if self._calm >= SETTLE:
                self.extra = self._calm = 0


class Windows:
    """Every window the gate keeps on its broker connection, and how far each may open.

    - ``prefetch``: the channel's prefetch window (``PrefetchWindow``);
    - ``shards``: each shard consumer's own window on RabbitMQ with shards
      (consumer_prefetch.py), given with each connection;
    - ``turns``: the Redis transport's reading order by held messages per shard
      (shard_turns.py), with shards on Redis.
    """

    def __init__(
        self,
        qos: Callable[[], Any],
        capacity: Callable[[], int],
        *,
        max_held: int,
        shards: int,
        driver: str,
        lanes: int = 0,
    ) -> None:
        """``qos``: the consumer's QoS now; ``capacity``: what the worker can start now (its
        slots and reserve: the core's capacity)."""
        self._capacity = capacity
        self.prefetch = PrefetchWindow(qos, max_held)
        self.opening = Opening(max_held)
        self.max_held = max_held
        self.shard_count = shards
        self.driver = driver
        self.shards: Any = None  # ShardWindows of this connection, or None
        self.turns: ShardTurns | None = None
        if driver == "redis" and shards > 1:
            self.turns = ShardTurns(shards, lambda: self.shard_window, lanes)

    @property
    def shard_window(self) -> int:
        """Each shard consumer's own window on RabbitMQ while nothing blocks: what the worker
        can start (its slots and reserve) plus one look (consumer_prefetch.py)."""
        return self._capacity() + 1

    def limit(self) -> int:
        """How many messages the gate should hold. O(1).

        The bound is for shards on Redis, whose transport pops the queues in strict turns: a
        newcomer's shard comes at most one turn after the burst's. RabbitMQ shares a full
        window's freed places among the queues by lot, so a newcomer could lose several draws
        to the burst: there each shard's consumer has a window of its own instead
        (consumer_prefetch.py), and the channel's may reach ``fair_max_held``. While a process
        idles that no held job can take, the gate takes in more, sweep by sweep, to find one
        that can run (``Opening``). A lane the gate holds messages of is one more look
        (core/lanes.py).

        Held stragglers (shard_turns.slot_of) take their places: places given to them would be
        taken by the next reads, from whatever queue has messages (a lane, once their shard is
        empty), and those then held past the limit would keep a newcomer's message unread
        until they ran. Their shard is read first instead (``ShardTurns.order``)."""
        if self.shard_count <= 1 or self.driver != "redis":
            return self.max_held
        looks = self.shard_count + (self.turns.lanes_held() if self.turns is not None else 0)
        return min(self.max_held, self._capacity() + looks + self.opening.extra)

    def follow(self, held: int, fair_inside: bool) -> None:
        """Keep the channel's window ahead of ``held`` messages (``PrefetchWindow.follow``)."""
        self.prefetch.follow(held, fair_inside, self.limit())

    def reset(self) -> None:
        """The connection is new, or gone: its QoS starts from Celery's own value (the shard
        consumers' windows come with the connection, through ``Gate.attach``)."""
        self.prefetch.reset()
