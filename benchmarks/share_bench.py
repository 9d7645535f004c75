"""A key's share: one tenant's ten backlogged keys against another tenant's one key.

Run by hand (docs/design.md section 5f, measurement 2; results in docs/benchmarks.md):

    python benchmarks/share_bench.py                      # both brokers, 3 runs
    python benchmarks/share_bench.py --brokers redis --runs 1

Each run starts one fresh ``celery worker -c 4`` on a fresh queue. Tenant T publishes
``--per-key`` jobs of 50 ms on each of its ten keys (round robin); right after, the solo tenant
publishes as many on its one key. Every key stays backlogged through the window
(``--window`` seconds from solo's first publish), over which we measure solo's share of the
slot-time (each job's run clipped to the window). The fairness rule gives each of the eleven
keys the same share: 1/11 = 0.091.

Variants, in the same rounds (their order alternates from round to round):

- ``plain``: plain Celery (``-P prefork``), one queue: solo waits behind T's backlog;
- ``hash/8``: ``-P fair``, 8 shards, keys ``t-0`` to ``t-9`` and ``solo``, which nobody chose
  for their hash: keys that share a shard share its FIFO, until they get lanes (with a store,
  as by default: every key here turns heavy, and has a lane of its own);
- ``apart/16``: ``-P fair``, 16 shards, the eleven keys chosen (``protocol.shard_of``) so that
  each has a shard of its own: a stand-in for a queue per backlogged key.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from collections.abc import Callable

import redis

from burst_bench import BROKERS, RECORD, app_for, finish, start_workers, wait_for_lanes
from celery_fair.protocol import shard_of

SECONDS = 0.05
VARIANTS = ("plain", "hash/8", "apart/16")


def keys_for(variant: str) -> tuple[list[str], str]:
    """T's ten keys and solo's key for ``variant``.

    >>> tenant, solo = keys_for("apart/16")
    >>> len({shard_of(k, 16) for k in [*tenant, solo]})
    11
    """
    if variant != "apart/16":
        return [f"t-{i}" for i in range(10)], "solo"
    taken: set[int] = set()

    def pick(prefix: str, count: int) -> list[str]:
        out, i = [], 0
        while len(out) < count:
            shard = shard_of(f"{prefix}-{i}", 16)
            if shard not in taken:
                taken.add(shard)
                out.append(f"{prefix}-{i}")
            i += 1
        return out

    tenant = pick("t", 10)
    return tenant, pick("solo", 1)[0]


def busy(record: redis.Redis, key: str, name: str, start: float, end: float) -> float:
    """Seconds ``name``'s jobs ran within [start, end] (a job still running counts to ``end``)."""
    began = dict(record.zrange(f"{key}:start:{name}", 0, -1, withscores=True))
    ended = dict(record.zrange(f"{key}:end:{name}", 0, -1, withscores=True))
    total = 0.0
    for member, at in began.items():
        until = ended.get(member, end)
        total += max(0.0, min(until, end) - max(at, start))
    return total


def run_once(broker: str, variant: str, per_key: int, window: float) -> float:
    queue = f"share-{uuid.uuid4().hex[:8]}"
    key = f"share:{queue}"
    shards = {"plain": 1, "hash/8": 8, "apart/16": 16}[variant]
    module = app_for(BROKERS[broker], queue, key, shards)
    record = redis.Redis.from_url(RECORD)
    env = {**os.environ, "BURST_SHARDS": str(shards)}
    procs = start_workers("plain" if variant == "plain" else "fair", "1x4", env, queue)
    tenant, solo = keys_for(variant)
    try:
        deadline = time.time() + 60
        while not module.app.control.ping(timeout=0.5):
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{variant} worker did not start")
        if shards > 1:
            wait_for_lanes(module.app)
        publish: Callable[[str], object] = lambda k: module.job.apply_async(  # noqa: E731
            [k, SECONDS], fairness_key=k
        )
        for _ in range(per_key):
            for k in tenant:
                publish(k)
        solo_published = time.time()
        for _ in range(per_key):
            publish(solo)
        end = solo_published + window
        while time.time() < end + SECONDS * 2:
            time.sleep(0.05)
        mine = busy(record, key, solo, solo_published, end)
        theirs = sum(busy(record, key, k, solo_published, end) for k in tenant)
        return mine / (mine + theirs) if mine + theirs else 0.0
    finally:
        finish(procs, module, queue, record, key, [*tenant, solo])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="redis,amqp")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-key", type=int, default=100)
    parser.add_argument("--window", type=float, default=5.0)
    args = parser.parse_args()
    variants = args.variants.split(",")
    print(f"solo's share of the slot-time over {args.window:.0f} s; the rule gives 1/11 = 0.091")
    print(f"{'broker':6} {'variant':9} {'p50':>6} {'min':>6} {'max':>6}  keys")
    for broker in args.brokers.split(","):
        got: dict[str, list[float]] = {v: [] for v in variants}
        for i in range(args.runs):
            for variant in variants if i % 2 == 0 else variants[::-1]:
                got[variant].append(run_once(broker, variant, args.per_key, args.window))
        for variant in variants:
            shares = got[variant]
            tenant, solo = keys_for(variant)
            n = 16 if variant == "apart/16" else 8
            print(
                f"{broker:6} {variant:9} {statistics.median(shares):6.3f} {min(shares):6.3f} "
                f"{max(shares):6.3f}  solo's shard of {n}: {shard_of(solo, n)}; "
                f"T's: {sorted(shard_of(k, n) for k in tenant)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
