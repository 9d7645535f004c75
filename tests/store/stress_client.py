"""One client process of the multi-process stress test (run as a script by test_stress.py).

Usage: stress_client.py URL PREFIX RECORD CYCLES SEED

Admits and finishes jobs on shared types with small caps and a few shared conflict ids. Around
each job body it keeps an independent record (INCR when it starts, DECR before it finishes,
under RECORD, outside the store's keys); a count above its cap is written down as a violation.
"""

from __future__ import annotations

import random
import sys

import redis

from celery_fair.core import CostLifecycle
from celery_fair.store import Ask, Done, RedisStore, Verdict, conflict_field, estimate_field

TYPES = {  # name: (priority, tier cap, type cap, conflict group)
    "clone": (8, 3, 2, "git"),
    "pull": (8, 3, None, "git"),
    "repack": (4, 1, None, ""),
}
IDS = ["linux", "git", "redis"]


def main() -> None:
    url, prefix, record, cycles, seed = sys.argv[1:6]
    rng = random.Random(int(seed))
    client = redis.Redis.from_url(url)
    store = RedisStore(client, prefix, lease=30.0, lifecycle=CostLifecycle())
    worker = f"stress-{seed}"
    for i in range(int(cycles)):
        asks = []
        for j in range(rng.randint(1, 2)):
            name = rng.choice(list(TYPES))
            prio, tier_cap, type_cap, group = TYPES[name]
            job_id = rng.choice(IDS)
            asks.append(
                Ask(f"{worker}-{i}-{j}", name, prio, tier_cap, type_cap,
                    conflict_field(group, job_id), estimate_field(name, job_id),
                    rng.choice(["alice", "bob", "carol"]), None, 1.0)
            )  # fmt: skip
        reply = store.admit(worker, asks)
        admitted = [
            (a, g) for a, g in zip(asks, reply.grants, strict=True) if g.verdict is Verdict.ADMITTED
        ]
        pipe = client.pipeline(transaction=False)
        for a, _ in admitted:
            pipe.incr(f"{record}:tier:{a.priority}")
            pipe.incr(f"{record}:type:{a.type}")
            pipe.incr(f"{record}:conflict:{a.conflict}" if a.conflict else f"{record}:none")
        counts = pipe.execute()
        for n, (a, _) in enumerate(admitted):
            tier, type_, conflict = counts[3 * n : 3 * n + 3]
            if (
                tier > (a.tier_cap or tier)
                or type_ > (a.type_cap or type_)
                or (a.conflict and conflict > 1)
            ):
                client.rpush(f"{record}:violations", f"{a.uid} {a.type} {tier} {type_} {conflict}")
        pipe = client.pipeline(transaction=False)
        for a, _ in admitted:
            pipe.decr(f"{record}:tier:{a.priority}")
            pipe.decr(f"{record}:type:{a.type}")
            pipe.decr(f"{record}:conflict:{a.conflict}" if a.conflict else f"{record}:none")
        pipe.execute()
        store.finish(worker, [Done(a.uid, g.token, rng.random() / 100) for a, g in admitted])
        client.incrby(f"{record}:cycles", 1)
        client.incrby(f"{record}:admitted", len(admitted))


if __name__ == "__main__":
    main()
