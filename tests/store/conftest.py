"""Stores under test: in memory, the real Redis on 127.0.0.1:6379, a real 3-master Redis
Cluster that the session starts on spare ports (tests/redis_cluster.py), and a real
Sentinel group (a master, a replica and a Sentinel, tests/redis_sentinel.py), which the
store finds through ``fair_store_url = "sentinel://..."``.

Each Redis store gets a random prefix, and its keys are removed with SCAN afterwards (never
FLUSHALL: the machine's Redis is shared). The cluster is the session's own.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from shared_redis import REDIS_URL, clean

from celery_fair.store import MemoryStore, RedisStore
from redis_cluster import running_cluster
from redis_sentinel import running_sentinel


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()  # a missing Redis fails the test; it is never skipped
    yield client
    client.close()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory) as formed:
        yield formed


@pytest.fixture(scope="session")
def sentinel(tmp_path_factory):
    with running_sentinel(tmp_path_factory) as group:
        yield group


@pytest.fixture(params=["memory", "redis", "cluster", "sentinel"])
def kind(request):
    return request.param


@pytest.fixture
def make_store(kind, redis_client, request):
    """``make_store(**options)``: a fresh store of the parametrised kind, one shared prefix."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    cluster = request.getfixturevalue("cluster") if kind == "cluster" else None
    group = request.getfixturevalue("sentinel") if kind == "sentinel" else None
    made = []

    def factory(**options):
        if kind == "memory":
            if made:  # several handles on one shared state, as several workers would have
                return made[0]
            store = MemoryStore(**options)
        elif kind == "cluster":
            store = RedisStore(cluster.client(), prefix, **options)
        elif kind == "sentinel":
            store = RedisStore.from_url(group.url(), prefix=prefix, **options)
        else:
            store = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, **options)
        made.append(store)
        return store

    yield factory
    for store in made:
        store.close()
    clean(redis_client, prefix)
