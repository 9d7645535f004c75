"""Stores under test: the in-memory one and the real Redis on 127.0.0.1:6379.

Each Redis store gets a random prefix, and its keys are removed with SCAN afterwards (never
FLUSHALL: the machine's Redis is shared).
"""

from __future__ import annotations

import uuid

import pytest
import redis
from shared_redis import REDIS_URL, clean

from celery_fair.store import MemoryStore, RedisStore


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()  # a missing Redis fails the test; it is never skipped
    yield client
    client.close()


@pytest.fixture(params=["memory", "redis"])
def kind(request):
    return request.param


@pytest.fixture
def make_store(kind, redis_client):
    """``make_store(**options)``: a fresh store of the parametrised kind, one shared prefix."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    made = []

    def factory(**options):
        if kind == "memory":
            if made:  # several handles on one shared state, as several workers would have
                return made[0]
            store = MemoryStore(**options)
        else:
            store = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, **options)
        made.append(store)
        return store

    yield factory
    for store in made:
        store.close()
    clean(redis_client, prefix)
