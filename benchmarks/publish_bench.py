"""What sharding costs a producer per publish, and what a hand of two shards would add.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/publish_bench.py                   # both brokers, 2,000 publishes, 5 rounds
    python benchmarks/publish_bench.py --clock cpu       # this process's CPU time, not the wall's

Per broker, in alternating rounds, the time per ``apply_async`` of a fair task (median over
rounds, microseconds):

- ``queue``: ``fair_shards = 1``: published to its queue, as plain Celery would;
- ``shard``: ``fair_shards = 8``, ``fair_lanes = 0``: to its key's shard (routing it costs a
  route lookup and a hash);
- ``lanes``: as ``shard``, with lanes (the default) and a shared store whose fleet agrees on 16
  lanes (a worker's announcement, made by the bench): each publish counts its key, each of the
  50 keys asks for its lane at its 17th publish within a second and goes there from then on,
  and the fleet's map is read about once a second (docs/operations.md, Lanes);
- ``lanes light``: as ``lanes``, each publish with a key of its own: none turns heavy, so this
  is the count and the map lookup alone, what a light client pays;
- ``hand of 2``: as ``shard``, after reading the depth of two candidate shards first, the
  price of publishing to the shorter of a hand of two (shuffle sharding): one pipelined
  ``LLEN`` round trip on Redis, two passive ``queue_declare`` on RabbitMQ;
- ``tracked``: as ``shard``, with ``fair_track_submits``: each submit recorded in the shared
  store first (one script call to the local Redis; on the Redis broker, the broker's Redis);
- ``plain``: a plain Celery task (``@app.task``, an app with no fair task), to its queue: the
  baseline of issue 35's goal for a fair task's ``apply_async`` (at most 1.10x this); under
  the medians, each variant's ratio to it, the median of the rounds' own ratios (a round runs
  the variants side by side, so its ratio leaves out most of the host's drift);
- ``untrack``: not a publish: what the worker pays per ended fair job with
  ``fair_track_submits`` (one script call forgetting it, in the process that ran it).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from typing import Any

from celery import Celery

from celery_fair import fair_task
from celery_fair.routing import Shards, shard_name, shard_of

#: What a publish is timed by: the wall clock, or (``--clock cpu``) this process's CPU time,
#: which leaves out the broker's round trip and the host's other work.
CLOCK = [time.perf_counter]

BROKERS = {
    "redis": "redis://127.0.0.1:6379/4",
    "amqp": "amqp://guest:guest@127.0.0.1:5672//",
}


STORE = "redis://127.0.0.1:6379/4"


def make_app(
    broker: str, queue: str, shards: int, tracked: bool = False, lanes: bool = False
) -> tuple[Any, Any]:
    app = Celery("publish", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=queue, fair_shards=shards, task_ignore_result=True)
    if tracked:
        app.conf.update(fair_track_submits=True, fair_store_url=STORE, fair_store_prefix=queue)
    if lanes:  # a store whose fleet consumes 16 lanes (announced by measure)
        app.conf.update(fair_store_url=STORE, fair_store_prefix=queue)
    else:
        app.conf.update(fair_lanes=0)

    @fair_task(app=app, name="publish.job", type="publish", priority=8)
    def job(i: int) -> None: ...

    return app, job


def depth_reader(app: Any, queue: str) -> Any:
    conn = app.connection_for_write()
    channel = conn.default_channel
    if conn.transport.driver_type == "redis":
        from celery_fair.redis_broker import redis_broker_client

        client = redis_broker_client(channel)

        def redis_depths(names: list[str]) -> list[int]:
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.llen(name)
            return [int(n) for n in pipe.execute()]

        return redis_depths

    def amqp_depths(names: list[str]) -> list[int]:
        return [channel.queue_declare(name, passive=True).message_count for name in names]

    return amqp_depths


def measure_plain(broker: str, n: int) -> float:
    """µs per ``apply_async`` of a plain Celery task to its queue."""
    queue = f"publish-{uuid.uuid4().hex[:8]}"
    app = Celery("publish", broker=BROKERS[broker], set_as_current=False)
    app.conf.update(task_default_queue=queue, task_ignore_result=True)

    @app.task(name="publish.plain")
    def job(i: int) -> None: ...

    try:
        job.apply_async([0])  # connections, declarations
        start = CLOCK[0]()
        for i in range(n):
            job.apply_async([i])
        return 1e6 * (CLOCK[0]() - start) / n
    finally:
        with app.connection_for_write() as conn:
            delete_queues(conn, broker, [queue])
        app.close()


def delete_queues(conn: Any, broker: str, names: list[str]) -> None:
    """Delete the queues ``names`` and what they hold. On Redis their lists too: Kombu's
    ``queue_delete`` deletes only the queues this connection bound, and a fresh one bound
    none (the runs' messages stayed in Redis before)."""
    for name in names:
        conn.default_channel.queue_delete(name)
    if broker == "redis":
        from celery_fair.redis_broker import redis_broker_client, redis_queue_lists

        lists = redis_queue_lists(conn.default_channel)
        client = redis_broker_client(conn.default_channel)
        client.delete(*(list_name for name in names for list_name in lists(name)))
        client.close()


def measure(broker: str, variant: str, n: int) -> float:
    if variant == "plain":
        return measure_plain(broker, n)
    queue = f"publish-{uuid.uuid4().hex[:8]}"
    tracked = variant in ("tracked", "untrack")
    lanes = variant.startswith("lanes")
    app, job = make_app(BROKERS[broker], queue, 1 if variant == "queue" else 8, tracked, lanes)
    try:
        job.apply_async([0], fairness_key="warm")  # connections, declarations
        with app.connection_for_write() as conn:  # every shard exists, as in a running fleet
            for shard in Shards.of(app).queues(app.amqp.queues[queue]):
                shard.bind(conn.default_channel).declare()
        if lanes:  # a fleet of one worker that consumes 16 lanes per queue
            from celery_fair.connect import shared_store

            shared_store(app).sweep_lanes("bench@here", 16, [], [])
            with app.connection_for_write() as conn:
                for j in range(16):
                    lane = Shards.of(app).lane(app.amqp.queues[queue], j)
                    lane.bind(conn.default_channel).declare()
        depths = depth_reader(app, queue) if variant == "hand of 2" else None
        if depths is not None:
            depths([shard_name(queue, 0), shard_name(queue, 1)])
        if variant == "untrack":
            from celery_fair.submissions import tracked_store

            store = tracked_store(app)
            ids = [job.apply_async([i], fairness_key="c").id for i in range(n)]
            start = CLOCK[0]()
            for task_id in ids:
                store.untrack([task_id])
            return 1e6 * (CLOCK[0]() - start) / n
        start = CLOCK[0]()
        for i in range(n):
            key = f"light{i}" if variant == "lanes light" else f"client{i % 50}"
            if depths is not None:
                first = shard_of(key, 8)
                depths([shard_name(queue, first), shard_name(queue, (first + 1) % 8)])
            job.apply_async([i], fairness_key=key)
        return 1e6 * (CLOCK[0]() - start) / n
    finally:
        with app.connection_for_write() as conn:
            from celery_fair.protocol import lane_name

            parts = [shard_name(queue, i) for i in range(8)] + [
                lane_name(queue, j) for j in range(16)
            ]
            delete_queues(conn, broker, [queue, *parts])
        if lanes:
            import redis

            client = redis.Redis.from_url(STORE)
            for stale in client.scan_iter(match=f"{{{queue}}}:*"):
                client.delete(stale)
            client.close()
        if tracked:
            import redis

            client = redis.Redis.from_url(STORE)
            client.delete(
                *(
                    f"{{{queue}}}:{name}"
                    for name in ("queued_by_key", "queued_by_time", "queued_entry")
                )
            )
            client.close()
        app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="redis,amqp")
    parser.add_argument("--publishes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--variants", default="plain,queue,shard,lanes,lanes light,hand of 2,tracked,untrack"
    )
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall")
    args = parser.parse_args()
    if args.clock == "cpu":
        CLOCK[0] = time.process_time
    variants = args.variants.split(",")
    print(f"{'broker':6} " + " ".join(f"{v:>10}" for v in variants) + "   (us per publish)")
    for broker in args.brokers.split(","):
        got: dict[str, list[float]] = {v: [] for v in variants}
        for i in range(args.rounds):
            for variant in variants if i % 2 == 0 else variants[::-1]:
                got[variant].append(measure(broker, variant, args.publishes))
        print(f"{broker:6} " + " ".join(f"{statistics.median(got[v]):>10.0f}" for v in variants))
        if "plain" in got:  # each round's own ratio (the variants ran side by side), median
            plain = got["plain"]
            ratios = " ".join(
                f"{statistics.median(a / b for a, b in zip(got[v], plain, strict=True)):>10.2f}"
                for v in variants
            )
            print(f"{'/plain':6} {ratios}")


if __name__ == "__main__":
    main()
