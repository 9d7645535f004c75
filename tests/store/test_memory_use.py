"""100,000 fairness keys seen once are gone after their TTL: nothing per key leaks."""

from __future__ import annotations

import uuid

import redis
from harness import wait_until
from shared_redis import REDIS_URL, clean

from celery_fair.core import CostLifecycle
from celery_fair.store import Ask, Done, RedisStore

KEYS = 100_000
BATCH = 1_000
TTL = 40.0


def test_a_hundred_thousand_one_off_keys_expire_and_free_their_memory(redis_client):
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    store = RedisStore(
        redis.Redis.from_url(REDIS_URL),
        prefix,
        # Long enough that no key expires while the 100k are written, even on a busy machine.
        lifecycle=CostLifecycle(cost_ttl=TTL, estimate_ttl=TTL),
    )
    try:
        before = redis_client.info("memory")["used_memory"]
        for start in range(0, KEYS, BATCH):
            asks = [
                Ask(f"j{i}", "clone", 8, None, None, "", f"5:clone={i}", f"client-{i}", None, 1.0)
                for i in range(start, start + BATCH)
            ]
            grants = store.admit("w1", asks).grants
            store.finish("w1", [Done(g.uid, g.token, 0.5) for g in grants])
        on_prefix = sum(1 for _ in redis_client.scan_iter(match=f"{{{prefix}}}:*"))
        keys = {name: f"{{{prefix}}}:{name}" for name in ("acc", "est", "seen", "estseen")}
        # One fixed set of keys holds them all, not a key per fairness key,
        assert on_prefix <= 13
        assert redis_client.hlen(keys["acc"]) == KEYS
        assert redis_client.hlen(keys["est"]) == KEYS
        grown = redis_client.info("memory")["used_memory"] - before

        # and after the TTL, heartbeats evict them in bounded steps until none is left.
        def evicted():
            store.heartbeat("w1", [], [])
            return redis_client.hlen(keys["acc"]) + redis_client.hlen(keys["est"]) == 0

        wait_until(evicted, 120, "100k keys to expire", every=0.01)
        for name in ("seen", "estseen"):
            assert redis_client.exists(keys[name]) == 0
        left = redis_client.info("memory")["used_memory"] - before
        assert left < grown / 10, (grown, left)
    finally:
        store.close()
        clean(redis_client, prefix)
