"""The lane watch: a worker tells the shared store which lanes it consumes and which are empty.

Lanes (core/lanes.py) are given out by the store's lane table, and only while every live
worker consumes them: so each fair worker with a store says, about once a second, how many
lanes it consumes (``fair_lanes``), and which lane numbers it found empty in every queue it
consumes (``q.fair.lane.<j>``, ``r.fair.lane.<j>``...): a key whose lease lapsed leaves its
lane only once sweeps have found the lane empty twice in a row, so a key with messages waiting
in its lane never leaves it, and its messages keep their order.

It also renews the lease of the keys whose lane the worker holds a backlog of (lanes_here.py):
a key the worker gave a lane (rule 3) has no producer to renew it.

It runs in a thread of its own, with a broker connection of its own on RabbitMQ (a passive
``queue.declare`` per lane, which answers with the number of messages ready) and a Redis
pipeline of ``LLEN`` on a Redis broker (each lane's list per priority step). Neither blocks
the event loop. A failure is logged once per episode; the store then sees no sweep from this
worker, and its keys keep their lanes (a lapse needs sweeps that found the lane empty).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterable
from typing import Any

from celery.utils.log import get_logger

from ..protocol import lane_name

__all__ = ["LaneWatch", "amqp_ready", "empty_lanes", "redis_ready"]

logger = get_logger(__name__)

#: Seconds between two looks.
EVERY = 1.0


def empty_lanes(
    lanes: int, queues: Iterable[str], ready: Callable[[list[str]], list[int]]
) -> set[int]:
    """The lane numbers below ``lanes`` whose lane is empty in every one of ``queues``, given
    ``ready``, which counts the messages waiting in each named queue.

    >>> waiting = {"q.fair.lane.1": 3}
    >>> sorted(empty_lanes(3, ["q", "r"], lambda names: [waiting.get(n, 0) for n in names]))
    [0, 2]
    """
    queues = list(queues)
    names = [lane_name(q, j) for j in range(lanes) for q in queues]
    counts = ready(names) if names else []
    busy = {j for j in range(lanes) for i, q in enumerate(queues) if counts[j * len(queues) + i]}
    return set(range(lanes)) - busy


def redis_ready(client: Any, lists: Callable[[str], list[str]]) -> Callable[[list[str]], list[int]]:
    """``ready`` on a Redis broker: one pipeline of ``LLEN`` over each queue's lists (one per
    priority step, ``redis_broker.redis_queue_lists``)."""

    def ready(names: list[str]) -> list[int]:
        keys = [lists(name) for name in names]
        with client.pipeline(transaction=False) as pipe:
            for per_step in keys:
                for key in per_step:
                    pipe.llen(key)
            lengths = iter(pipe.execute())
        return [sum(next(lengths) for _ in per_step) for per_step in keys]

    return ready


def amqp_ready(connection: Any) -> Callable[[list[str]], list[int]]:
    """``ready`` on RabbitMQ: a passive ``queue.declare`` per queue, on a channel of
    ``connection``'s. A queue not declared yet has nothing waiting (RabbitMQ closes the channel
    over it: the next is asked on a new one)."""
    from amqp.exceptions import NotFound

    state: dict[str, Any] = {}

    def ready(names: list[str]) -> list[int]:
        out = []
        for name in names:
            if state.get("channel") is None:
                state["channel"] = connection.channel()
            try:
                out.append(int(state["channel"].queue_declare(name, passive=True).message_count))
            except NotFound:
                state["channel"] = None
                out.append(0)
            except Exception:  # the connection is gone: the next look connects anew
                state["channel"] = None
                connection.close()
                raise
        return out

    return ready


class LaneWatch(threading.Thread):
    """Every ``EVERY`` seconds: ``store.sweep_lanes(worker, lanes, looked, empty)`` for the
    lanes of ``queues()`` (the queues this worker consumes now), ``store.renew_lanes`` for the
    keys ``renew()`` says still need their lane (a backlog here, lanes_here.py), then
    ``refresh()`` (the worker's copy of the fleet's map, ``routing.Lanes.current``). ``stop``
    ends it."""

    def __init__(
        self,
        store: Any,
        worker: str,
        lanes: int,
        queues: Callable[[], Collection[str]],
        ready: Callable[[list[str]], list[int]],
        close: Callable[[], None] = lambda: None,
        every: float = EVERY,
        refresh: Callable[[], object] = lambda: None,
        renew: Callable[[], Collection[str]] = list,
    ) -> None:
        super().__init__(name="celery-fair lane watch", daemon=True)
        self.store = store
        self.worker = worker
        self.lanes = lanes
        self.queues = queues
        self.ready = ready
        self._close = close
        self.every = every
        self._refresh = refresh
        self._renew = renew
        self._stopped = threading.Event()
        self._failing = False

    def run(self) -> None:
        try:
            while not self._stopped.is_set():
                self.look()
                self._stopped.wait(self.every)
        finally:
            self._close()

    def look(self) -> None:
        """One look and report; a failure is logged once until one succeeds."""
        try:
            queues = list(self.queues())
            looked = range(self.lanes) if queues else range(0)  # none consumed: none seen
            empty = empty_lanes(self.lanes, queues, self.ready) if queues else set()
            self.store.sweep_lanes(self.worker, self.lanes, looked, empty)
            backlogged = list(self._renew())
            if backlogged:
                self.store.renew_lanes(backlogged)
            self._refresh()  # the fleet's map, read here, off the event loop, for the gate
        except Exception as exc:
            if not self._failing:
                self._failing = True
                logger.warning("celery-fair: could not look at the lanes (%r); trying on.", exc)
            return
        if self._failing:
            self._failing = False
            logger.warning("celery-fair: the lanes are looked at again.")

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        if self.is_alive():
            self.join(timeout)
