"""What the broker holds in a queue, its shards and its lanes: how many messages wait in each,
who consumes it (RabbitMQ), and which fairness keys fill it (Redis). ``celery-fair shards``.

It changes nothing: on Redis it reads list lengths and the oldest messages of each list; on
RabbitMQ it declares each queue passively (a queue cannot be read there without taking its
messages, so no keys are shown).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Any

from .core import key_label
from .protocol import lane_name, shard_name
from .worker.headers import FAIRNESS_KEY

__all__ = ["queue_depths"]


def queue_depths(
    connection: Any, queues: Iterable[str], shards: int, sample: int = 200, lanes: int = 0
) -> list[dict[str, Any]]:
    """For each queue, each of its ``shards`` shards and each of its first ``lanes`` lanes
    that has messages waiting: ``waiting`` messages, ``consumers`` (RabbitMQ; ``None`` on
    Redis, which does not know), and ``keys``: the fairness keys of the oldest ``sample``
    messages with how many each (Redis; ``None`` on RabbitMQ)."""
    read = _redis_reader(connection, sample) if _is_redis(connection) else _amqp_reader(connection)
    out = []
    for queue in queues:
        names = [queue, *(shard_name(queue, i) for i in range(shards))]
        lists = [{"name": n, **read(n)} for n in names]
        for j in range(lanes):
            lane = {"name": lane_name(queue, j), **read(lane_name(queue, j))}
            if lane["waiting"]:
                lists.append(lane)
        out.append({"queue": queue, "lists": lists})
    return out


def _is_redis(connection: Any) -> bool:
    return bool(connection.transport.driver_type == "redis")


def _redis_reader(connection: Any, sample: int) -> Any:
    from .redis_broker import redis_broker_client, redis_queue_lists

    channel = connection.default_channel
    lists, client = redis_queue_lists(channel), redis_broker_client(channel)

    def read(name: str) -> dict[str, Any]:
        keys: Counter[str] = Counter()
        waiting = 0
        for key in lists(name):
            waiting += client.llen(key)
            for raw in client.lrange(key, -sample, -1) if sample else ():
                keys[_key_of(raw)] += 1
        return {"waiting": waiting, "consumers": None, "keys": dict(keys.most_common())}

    return read


def _key_of(raw: bytes) -> str:
    try:
        value = (json.loads(raw).get("headers") or {}).get(FAIRNESS_KEY)
    except (ValueError, AttributeError):
        return "(unreadable)"
    return value if isinstance(value, str) and value else "(no key)"


def _amqp_reader(connection: Any) -> Any:
    from amqp.exceptions import NotFound

    state = {"channel": connection.channel()}

    def read(name: str) -> dict[str, Any]:
        try:
            ok = state["channel"].queue_declare(name, passive=True)
        except NotFound:  # never declared: nothing waits there; the channel is closed
            state["channel"] = connection.channel()
            return {"waiting": 0, "consumers": 0, "keys": None}
        return {"waiting": ok.message_count, "consumers": ok.consumer_count, "keys": None}

    return read


def format_depths(depths: list[dict[str, Any]], top: int = 3) -> str:
    """``queue_depths``' answer as text for people."""
    lines = []
    for entry in depths:
        total = sum(item["waiting"] for item in entry["lists"])
        lines.append(f"queue {entry['queue']}: {total} waiting")
        width = max(len(item["name"]) for item in entry["lists"])
        for item in entry["lists"]:
            row = f"  {item['name']:<{width}}  {item['waiting']:>8} waiting"
            if item["consumers"] is not None:
                row += f"  {item['consumers']:>3} consumers"
            if item["keys"]:
                most = list(item["keys"].items())[:top]
                row += "  oldest by key: " + ", ".join(f"{key_label(k)} {n}" for k, n in most)
            lines.append(row)
    return "\n".join(lines)
