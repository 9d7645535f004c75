"""Fair shard queues: a fair job goes to one of its queue's shards, chosen by its fairness key.

A queue is first in, first out: one client's burst published to ``q`` stands in front of every
message published after it, and a worker sees a newcomer only once it has taken in the burst.
With ``fair_shards = N`` (N > 1), a fair job with a fairness key is published instead to
``q.fair.<i>``, ``i = shard_of(key, N)``, and a fair worker that consumes ``q`` consumes its
shards too, in turns (Kombu's Redis transport rotates the queues it pops from; RabbitMQ
delivers from each queue with credit). A burst then fills its own key's shard, and a newcomer
with another key is in another shard, one turn away. Jobs without a fairness key stay in ``q``.

``shard_of`` is the one rule both sides use: the producer here, and the intake's Lua script,
which moves fair messages that producers published to ``q`` into their shards. It is the wire
protocol's (protocol.py, with the shard names and ``SHARD_HASH``), named here too; this module
adds what needs Kombu and an app: the shard queues, the router, the worker's consumption.

A shard is declared like its base queue: same exchange, queue arguments (``x-max-priority``,
``x-queue-type``), durability; its routing key is the base's plus ``.fair.<i>``. Shards are
registered in ``app.amqp.queues`` before use, so retries, which publish to a queue by name,
find them, and Celery's delayed delivery binds them.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from celery.utils.log import get_logger
from kombu.entity import Queue

from .connect import settings_of, shared_store
from .core.lanes import HeavyKeys, LaneMap
from .protocol import (
    DEFAULT_SHARDS,
    FAIRNESS_KEY,
    SHARD_HASH,
    base_name,
    check_text,
    lane_index,
    lane_name,
    shard_count,
    shard_index,
    shard_name,
    shard_of,
)
from .redis_broker import MOVE_SCRIPT, laned_pairs, redis_broker_client, redis_queue_lists, reroute

__all__ = [
    "DEFAULT_SHARDS",
    "SHARD_HASH",
    "Lanes",
    "Shards",
    "base_name",
    "consume_shards",
    "fair_router",
    "follow_consumer_changes",
    "is_part",
    "resolve_base",
    "shard_count",
    "shard_index",
    "shard_name",
    "shard_of",
]


logger = get_logger(__name__)


def shard_queue(base: Any, index: int, name: Callable[[str, int], str] = shard_name) -> Queue:
    """Shard ``index`` of ``base`` (or lane ``index``, with ``name=lane_name``), declared like
    it (exchange, arguments, durability)."""
    spec = base.as_dict()
    spec.update(
        name=name(base.name, index),
        routing_key=name(base.routing_key or base.name, index),
        alias=None,
        # Celery's Queues mutate queue_arguments in place: never share them with the base.
        queue_arguments=dict(base.queue_arguments or {}) or None,
        consumer_arguments=dict(base.consumer_arguments or {}) or None,
        binding_arguments=dict(getattr(base, "binding_arguments", None) or {}) or None,
    )
    return Queue(**spec)


class Shards:
    """One app's shard queues: how many per queue (``fair_shards``, read at each use), and the
    registered ``Queue`` objects. Use ``Shards.of(app)``, one per app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self._known: dict[tuple[str, int], list[Queue]] = {}
        self._lanes: dict[tuple[str, int], Queue] = {}
        self.consumed_lanes = 0  # lanes per queue this worker consumes (consume_shards)

    @classmethod
    def of(cls, app: Any) -> Shards:
        return _one_per_app(_PER_APP, app, cls)

    @property
    def count(self) -> int:
        return shard_count(self.app.conf)

    @property
    def enabled(self) -> bool:
        return self.count > 1

    def queues(self, base: Queue, count: int | None = None) -> list[Queue]:
        """The shards of ``base`` (``count`` of them: ``fair_shards`` unless the caller read
        it already), registered in ``app.amqp.queues`` (once)."""
        if count is None:
            count = self.count
        known = self._known.get((base.name, count))
        if known is None:
            queues = self.app.amqp.queues
            known = self._known[base.name, count] = []
            for i in range(count):
                name = shard_name(base.name, i)
                if name not in queues:  # ``in``: a missing name would be created on lookup
                    queues.add(shard_queue(base, i))
                known.append(queues[name])
        return known

    def parts(self, base: Queue) -> list[Queue]:
        """What a fair worker consumes besides ``base``: its shards, and its first
        ``consumed_lanes`` lanes."""
        return [*self.queues(base), *(self.lane(base, j) for j in range(self.consumed_lanes))]

    def lane(self, base: Queue, index: int) -> Queue:
        """Lane ``index`` of ``base``, registered in ``app.amqp.queues`` (once)."""
        known = self._lanes.get((base.name, index))
        if known is None:
            queues = self.app.amqp.queues
            name = lane_name(base.name, index)
            if name not in queues:
                queues.add(shard_queue(base, index, lane_name))
            known = self._lanes[base.name, index] = queues[name]
        return known

    def queue_for(self, base: Queue | str, fairness_key: str, count: int | None = None) -> Queue:
        """Where a fair job of ``fairness_key`` bound for ``base`` (or one of its shards or
        lanes) goes: its key's lane if it has one now (``Lanes``), else its key's shard among
        ``count`` (``fair_shards`` unless the caller read it already: once a publish).
        Counts the publish (a key that turns heavy asks for a lane)."""
        name = base_name(base if isinstance(base, str) else base.name)
        queue = self.app.amqp.queues[name]
        lane = Lanes.of(self.app).lane_for(fairness_key, name)
        if lane is not None:
            return self.lane(queue, lane)
        if count is None:
            count = self.count
        return self.queues(queue, count)[shard_of(fairness_key, count)]

    def route(
        self, options: dict[str, Any], fairness_key: str | None, base: Any, count: int | None = None
    ) -> None:
        """Point ``options`` (of a publish) at the shard of ``fairness_key`` for ``base``;
        leave them alone for a job without a key, or with sharding off (``count``:
        ``fair_shards`` as the caller read it for this publish, else read here)."""
        if not fairness_key:
            return
        if count is None:
            count = self.count
        if count <= 1:
            return
        shard = options["queue"] = self.queue_for(base, fairness_key, count)
        # The shard's own exchange and routing key decide (a route's or the task's would send
        # it to the base): on a direct exchange, the default exchange and the shard's name, as
        # Celery itself publishes to a direct queue.
        exchange = shard.exchange
        if exchange is None or exchange.type == "direct":
            options["exchange"], options["routing_key"] = "", shard.name
        else:
            options["exchange"], options["routing_key"] = exchange.name, shard.routing_key


def is_part(name: str) -> bool:
    """``name`` is a shard's or a lane's, not a queue's own."""
    return shard_index(name) is not None or lane_index(name) is not None


def consume_shards(app: Any, lanes: int = 0) -> list[str]:
    """Make a fair worker consume the shards of every queue it consumes, and its first
    ``lanes`` lanes: ``-Q q`` (or the default queue) means ``q``, its shards and those lanes.
    Returns the queues given shards."""
    shards = Shards.of(app)
    if not shards.enabled:
        return []
    shards.consumed_lanes = lanes
    queues = app.amqp.queues
    bases = [q for q in list(queues.consume_from.values()) if not is_part(q.name)]
    for base in bases:
        for part in shards.parts(base):
            queues.select_add(part)
    return [base.name for base in bases]


def follow_consumer_changes(consumer: Any) -> None:
    """Make ``add_consumer``/``cancel_consumer`` (remote control) on a queue do the same on
    its shards."""
    shards = Shards.of(consumer.app)
    if not shards.enabled:
        return
    add, cancel = consumer.add_task_queue, consumer.cancel_task_queue

    def add_task_queue(queue: str, *args: Any, **kwargs: Any) -> None:
        add(queue, *args, **kwargs)
        if not is_part(queue):
            for part in shards.parts(consumer.app.amqp.queues[queue]):
                add(part.name)

    def cancel_task_queue(queue: str) -> None:
        cancel(queue)
        if not is_part(queue):
            for i in range(shards.count):
                cancel(shard_name(queue, i))
            for j in range(shards.consumed_lanes):
                cancel(lane_name(queue, j))

    consumer.add_task_queue = add_task_queue
    consumer.cancel_task_queue = cancel_task_queue


_PER_APP: weakref.WeakKeyDictionary[Any, Shards] = weakref.WeakKeyDictionary()
T = TypeVar("T")


def _one_per_app(known: weakref.WeakKeyDictionary[Any, T], app: Any, make: Callable[[Any], T]) -> T:
    found = known.get(app)
    if found is None:
        found = known[app] = make(app)
    return found


class Lanes:
    """One app's lanes, as its producers in this process see them (core/lanes.py): which
    keys go to a lane of their own now. Use ``Lanes.of(app)``, one per app.

    Each publish counts (``HeavyKeys``); the publish that makes a key heavy asks the shared
    store for its lane (one round trip, once per heavy episode), and on a Redis broker moves
    the key's messages already in its shard to the consuming end of the lane first (one more,
    ``_reroute``), so they still start before it. About once a second a publish
    also renews the lanes of the keys still heavy here and reads the fleet's map if it changed
    (one round trip each). Otherwise a publish costs a dict lookup. No store (``fair_lanes``
    0, one shard, or no shared store): no lanes, every key to its shard. A store that fails
    is logged, never raised into ``apply_async``: the keys go where the last map said.
    """

    REFRESH = 1.0  # seconds between two reads of the fleet's map

    def __init__(self, app: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self._clock = clock
        settings = settings_of(app)
        self.enabled = settings.lanes > 0 and shard_count(app.conf) > 1
        self.heavy = HeavyKeys(settings.lane_threshold)
        self.map = LaneMap(-1, {})  # version -1: not read yet
        self._next_read = float("-inf")
        self._store: Any = None
        self._opened = False
        self._lock = threading.Lock()
        self._failing = False  # a store call failed, and none succeeded since (logged once)
        self.lane_count = settings.lanes
        self._mover: Any = None  # (move.lua on the broker, its lists), False: not Redis
        self._mover_lock = threading.Lock()
        self._moving_fails = False  # a reroute failed, and none succeeded since (logged once)
        self.rerouted = 0  # stragglers this process moved to their lanes

    @classmethod
    def of(cls, app: Any) -> Lanes:
        return _one_per_app(_LANES, app, cls)

    def lane_for(self, fairness_key: str, base: str | None = None) -> int | None:
        """Count a publish of ``fairness_key`` to queue ``base``: the lane it goes to, or
        ``None`` (its shard). The publish that gives the key its lane first moves its
        stragglers from its shard of ``base`` (``_reroute``)."""
        if not self.enabled:
            return None
        now = self._clock()
        if now >= self._next_read:
            self._refresh(now)
        turned = self.heavy.publish(fairness_key, now)
        lane = self.map.lane_of(fairness_key)
        if lane is None and turned and self.enabled:
            lane = self.ask(fairness_key)
            if lane is not None and base is not None:
                self._reroute(shard_name(base, shard_of(fairness_key, shard_count(self.app.conf))))
        return lane

    def _reroute(self, shard: str) -> None:
        """A key just got its lane here, and this process published up to the threshold of
        its messages to ``shard`` before it knew: on a Redis broker, move the messages of keys
        with a lane among the shard's oldest to the consuming end of their lanes, oldest
        nearest (``redis_broker.reroute``: one atomic script call), so that they pop before
        the key's first message in its lane and its jobs start in the order it published
        them. Another broker: nothing (RabbitMQ's gate reads past them and orders what it
        holds, worker/consumer_prefetch.py). A broker that fails is logged once, never raised
        into ``apply_async``: the stragglers then wait for a worker's intake, as before."""
        try:
            mover = self._open_mover()
            if not mover:
                return
            move, lists = mover
            laned = laned_pairs(self.map.lanes, self.lane_count)
            self.rerouted += reroute(move, lists, shard, self.lane_count, laned)[0]
        except Exception as exc:
            if not self._moving_fails:
                self._moving_fails = True
                logger.warning(
                    "celery-fair: could not move a key's messages from %s to its lane (%r); "
                    "a worker's intake moves them when it reaches them.",
                    shard,
                    exc,
                )
            return
        self._moving_fails = False

    def _open_mover(self) -> Any:
        """(move.lua registered on the broker's server, its lists of a queue), or ``False``
        for a broker that is not Redis. Opened at the first use and kept."""
        with self._mover_lock:
            if self._mover is None:
                connection = self.app.connection_for_write()
                try:
                    if connection.transport.driver_type != "redis":
                        self._mover = False
                    else:
                        channel = connection.default_channel
                        client = redis_broker_client(channel)
                        lists = redis_queue_lists(channel)
                        self._mover = (client.register_script(MOVE_SCRIPT), lists)
                finally:
                    connection.release()
            return self._mover

    def current(self) -> LaneMap:
        """The fleet's map as this process knows it (read again if a second old), for a
        mover that counts keys itself (the Redis intake); empty without lanes."""
        if self.enabled:
            now = self._clock()
            if now >= self._next_read:
                self._refresh(now)
        return self.map

    def _open(self) -> Any:
        if not self._opened:
            self._opened = True
            self._store = shared_store(self.app)
            if self._store is None:
                self.enabled = False
        return self._store

    def _refresh(self, now: float) -> None:
        if not self._lock.acquire(blocking=False):  # another thread reads it now
            return
        try:
            self._next_read = now + self.REFRESH
            store = self._open()
            if store is None:
                return
            mine = [key for key in self.heavy.heavy(now) if self.map.lane_of(key) is not None]
            if mine:
                store.renew_lanes(mine)
            new = store.lanes(self.map.version)
            if new is not None:
                self.map = new
            self._recovered()
        except Exception as exc:
            self._failed("read the lanes", exc)
        finally:
            self._lock.release()

    def ask(self, fairness_key: str) -> int | None:
        """``fairness_key`` turned heavy: ask the store for its lane (``None``: none given,
        or the store did not answer, logged)."""
        store = self._open()
        if store is None:
            return None
        try:
            lane: int | None = store.ask_lane(fairness_key)
        except Exception as exc:
            self._failed("ask for a lane", exc)
            return None
        self._recovered()
        if lane is not None:
            self.map = LaneMap(self.map.version, {**self.map.lanes, fairness_key: lane})
        return lane

    def learn(self, fairness_key: str, lane: int) -> None:
        """``fairness_key`` has lane ``lane`` (a worker saw a message of it come from there):
        route by it until the next read of the fleet's map says otherwise."""
        self.map = LaneMap(self.map.version, {**self.map.lanes, fairness_key: lane}, self.map.size)

    def _failed(self, what: str, exc: Exception) -> None:
        if not self._failing:
            self._failing = True
            logger.warning(
                "celery-fair: could not %s in the shared store (%r); keys go where the last "
                "map said until it answers.",
                what,
                exc,
            )

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            logger.warning("celery-fair: the shared store answers again; lanes are read anew.")


_LANES: weakref.WeakKeyDictionary[Any, Lanes] = weakref.WeakKeyDictionary()


def resolve_base(app: Any, name: str, args: Any, kwargs: Any, options: dict[str, Any]) -> Queue:
    """The queue Celery would publish to with ``options`` (a shard counts as its base):
    an explicit ``queue``, else ``task_routes``, else the default queue."""
    queue = options.get("queue")
    if isinstance(queue, Queue):
        queue = queue.name
    router = app.amqp.router
    if not router.routes:  # no task_routes: the queue named, else the default (as Celery)
        name_of = base_name(queue) if isinstance(queue, str) and queue else None
        destination = router.expand_destination(name_of or app.conf.task_default_queue)
        return destination["queue"]  # type: ignore[no-any-return]
    options = dict(options)
    if isinstance(queue, str):
        options["queue"] = base_name(queue)
    task = app.tasks.get(name)
    route: Mapping[str, Any] = router.route(options, name, args, kwargs, task)
    return route["queue"]  # type: ignore[no-any-return]


class _FairRouter:
    """``fair_router``'s router: the inner routes decide, then a keyed message goes to its shard."""

    def __init__(self, app: Any, routes: Sequence[Any]) -> None:
        from celery.app.routes import prepare

        self.app = app
        self.routes = prepare(list(routes))

    def __call__(
        self,
        name: str,
        args: Any,
        kwargs: Any,
        options: dict[str, Any],
        task: Any = None,
        **_: Any,
    ) -> Any:
        route = self._inner(name, args, kwargs, options, task)
        key = (options.get("headers") or {}).get(FAIRNESS_KEY)
        if not isinstance(key, str) or not key:
            return route
        shards = Shards.of(self.app)
        count = shards.count  # fair_shards, read once for this publish
        if count <= 1:
            return route
        check_text(FAIRNESS_KEY, key)  # refused here: the shard hash cannot read it
        base = options.get("queue") or (route or {}).get("queue")
        shard = shards.queue_for(base or self.app.conf.task_default_queue, key, count)
        if "queue" in options:  # an explicit queue beats what a router returns: replace it too
            options["queue"] = shard
        return {**(route or {}), "queue": shard}

    def _inner(self, name: str, args: Any, kwargs: Any, options: Any, task: Any) -> Any:
        query = self.app.amqp.router.query_router
        for router in self.routes:
            route = query(router, name, args, kwargs, options, task)
            if route is not None:
                return {"queue": route} if isinstance(route, str) else dict(route)
        return None


def fair_router(app: Any, *routes: Any) -> Any:
    """A ``task_routes`` entry that puts messages carrying a fairness key in their shard.

    For producers that publish fair jobs with ``send_task`` and ``fair_headers(...)``
    (``@fair_task`` tasks shard by themselves). Give it your other routes, which decide the
    base queue as before::

        app.conf.task_routes = [fair_router(app, {"git.*": {"queue": "git"}})]
    """
    return _FairRouter(app, routes)
