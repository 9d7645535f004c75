"""100,000 fairness keys seen once are gone after their TTL: nothing per key leaks."""

from __future__ import annotations

import uuid

import redis
from harness import wait_until

from celery_fair.core import CostLifecycle
from celery_fair.store import Ask, Done, RedisStore

KEYS = 100_000
BATCH = 1_000
TTL = 2.0


def test_a_hundred_thousand_one_off_keys_expire_and_free_their_memory(private_redis):
    # A Redis of the test's own, so that its memory is this test's alone (tests beside it write
    # to the shared one), and two handles on one store: the writer keeps every key however
    # long the writing takes on a loaded host (the TTL that applies is the one the caller
    # doing the housekeeping passes), the sweeper forgets those idle for TTL seconds.
    client = redis.Redis.from_url(private_redis.url)
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    hour = CostLifecycle(cost_ttl=3600.0, estimate_ttl=3600.0)
    writer = RedisStore(redis.Redis.from_url(private_redis.url), prefix, lifecycle=hour)
    short = CostLifecycle(cost_ttl=TTL, estimate_ttl=TTL)
    sweeper = RedisStore(redis.Redis.from_url(private_redis.url), prefix, lifecycle=short)
    try:
        before = client.info("memory")["used_memory"]
        for start in range(0, KEYS, BATCH):
            asks = [
                Ask(f"j{i}", "clone", 8, None, None, "", f"5:clone={i}", f"client-{i}", None, 1.0)
                for i in range(start, start + BATCH)
            ]
            grants = writer.admit("w1", asks).grants
            writer.finish("w1", [Done(g.uid, g.token, 0.5) for g in grants])
        on_prefix = sum(1 for _ in client.scan_iter(match=f"{{{prefix}}}:*"))
        keys = {name: f"{{{prefix}}}:{name}" for name in ("acc", "est", "seen", "estseen")}
        # One fixed set of keys holds them all, not a key per fairness key,
        assert on_prefix <= 13
        assert client.hlen(keys["acc"]) == KEYS
        assert client.hlen(keys["est"]) == KEYS
        grown = client.info("memory")["used_memory"] - before

        # and after the TTL, heartbeats evict them in bounded steps until none is left.
        def evicted():
            sweeper.heartbeat("w1", [], [])
            return client.hlen(keys["acc"]) + client.hlen(keys["est"]) == 0

        wait_until(evicted, 120, "100k keys to expire", every=0.01)
        for name in ("seen", "estseen"):
            assert client.exists(keys[name]) == 0
        left = client.info("memory")["used_memory"] - before
        assert left < grown / 10, (grown, left)
    finally:
        writer.close()
        sweeper.close()
        client.close()
