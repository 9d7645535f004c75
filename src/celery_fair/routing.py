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

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from kombu.entity import Queue

from .protocol import (
    DEFAULT_SHARDS,
    FAIRNESS_KEY,
    SHARD_HASH,
    base_name,
    check_text,
    shard_count,
    shard_index,
    shard_name,
    shard_of,
)

__all__ = [
    "DEFAULT_SHARDS",
    "SHARD_HASH",
    "Shards",
    "base_name",
    "consume_shards",
    "fair_router",
    "follow_consumer_changes",
    "resolve_base",
    "shard_count",
    "shard_index",
    "shard_name",
    "shard_of",
]


def shard_queue(base: Any, index: int) -> Queue:
    """Shard ``index`` of ``base``, declared like it (exchange, arguments, durability)."""
    spec = base.as_dict()
    spec.update(
        name=shard_name(base.name, index),
        routing_key=shard_name(base.routing_key or base.name, index),
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

    @classmethod
    def of(cls, app: Any) -> Shards:
        shards = _PER_APP.get(app)
        if shards is None:
            shards = _PER_APP[app] = cls(app)
        return shards

    @property
    def count(self) -> int:
        return shard_count(self.app.conf)

    @property
    def enabled(self) -> bool:
        return self.count > 1

    def queues(self, base: Queue) -> list[Queue]:
        """The shards of ``base``, registered in ``app.amqp.queues`` (once)."""
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

    def queue_for(self, base: Queue | str, fairness_key: str) -> Queue:
        """Where a fair job of ``fairness_key`` bound for ``base`` (or one of its shards) goes."""
        name = base_name(base if isinstance(base, str) else base.name)
        return self.queues(self.app.amqp.queues[name])[shard_of(fairness_key, self.count)]

    def route(self, options: dict[str, Any], fairness_key: str | None, base: Any) -> None:
        """Point ``options`` (of a publish) at the shard of ``fairness_key`` for ``base``;
        leave them alone for a job without a key, or with sharding off."""
        if not fairness_key or not self.enabled:
            return
        shard = options["queue"] = self.queue_for(base, fairness_key)
        # The shard's own exchange and routing key decide (a route's or the task's would send
        # it to the base): on a direct exchange, the default exchange and the shard's name, as
        # Celery itself publishes to a direct queue.
        exchange = shard.exchange
        if exchange is None or exchange.type == "direct":
            options["exchange"], options["routing_key"] = "", shard.name
        else:
            options["exchange"], options["routing_key"] = exchange.name, shard.routing_key


def consume_shards(app: Any) -> list[str]:
    """Make a fair worker consume the shards of every queue it consumes: ``-Q q`` (or the
    default queue) means ``q`` and its shards. Returns the queues given shards."""
    shards = Shards.of(app)
    if not shards.enabled:
        return []
    queues = app.amqp.queues
    bases = [q for q in list(queues.consume_from.values()) if shard_index(q.name) is None]
    for base in bases:
        for shard in shards.queues(base):
            queues.select_add(shard)
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
        if shard_index(queue) is None:
            for shard in shards.queues(consumer.app.amqp.queues[queue]):
                add(shard.name)

    def cancel_task_queue(queue: str) -> None:
        cancel(queue)
        if shard_index(queue) is None:
            for i in range(shards.count):
                cancel(shard_name(queue, i))

    consumer.add_task_queue = add_task_queue
    consumer.cancel_task_queue = cancel_task_queue


_PER_APP: weakref.WeakKeyDictionary[Any, Shards] = weakref.WeakKeyDictionary()


def resolve_base(app: Any, name: str, args: Any, kwargs: Any, options: dict[str, Any]) -> Queue:
    """The queue Celery would publish to with ``options`` (a shard counts as its base):
    an explicit ``queue``, else ``task_routes``, else the default queue."""
    options = dict(options)
    queue = options.get("queue")
    if isinstance(queue, Queue):
        queue = queue.name
    if isinstance(queue, str):
        options["queue"] = base_name(queue)
    task = app.tasks.get(name)
    route: Mapping[str, Any] = app.amqp.router.route(options, name, args, kwargs, task)
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
        shards = Shards.of(self.app)
        if not isinstance(key, str) or not key or not shards.enabled:
            return route
        check_text(FAIRNESS_KEY, key)  # refused here: the shard hash cannot read it
        base = options.get("queue") or (route or {}).get("queue")
        shard = shards.queue_for(base or self.app.conf.task_default_queue, key)
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
