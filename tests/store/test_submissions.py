"""Idempotent submits (submissions.py) from real producers on the real Redis: a duplicate of
(fairness key, idempotency key) publishes nothing and gets the first task id."""

from __future__ import annotations

import threading
import uuid

import pytest
import redis
from celery import Celery
from shared_redis import REDIS_URL

from celery_fair import fair_task
from celery_fair.errors import ConfigurationError
from celery_fair.submissions import submit_once


@pytest.fixture
def producer():
    """An app publishing to the real Redis broker, and how many messages its queue holds."""
    prefix = f"test-submit-{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(REDIS_URL)
    made = []

    def make(**conf):
        app = Celery(broker=REDIS_URL, set_as_current=False)
        app.conf.update(
            fair_store_prefix=prefix,
            fair_shards=1,
            broker_transport_options={"global_keyprefix": f"{prefix}:"},
            **conf,
        )

        @fair_task(app=app, name="t.clone", type="clone")
        def clone(repo: str) -> str:
            return repo

        made.append(app)
        return app, clone

    def published() -> int:
        return int(client.llen(f"{prefix}:celery"))

    yield make, published
    for app in made:
        app.close()
    for pattern in (f"{prefix}:*", f"{{{prefix}}}:*"):
        for key in client.scan_iter(match=pattern, count=1000):
            client.delete(key)
    client.close()


def test_a_duplicate_publishes_nothing_and_gets_the_first_task_id(producer):
    make, published = producer
    _, clone = make()
    first = clone.apply_async(["linux"], fairness_key="alice", idempotency_key="order-17")
    again = clone.apply_async(["linux"], fairness_key="alice", idempotency_key="order-17")
    assert again.id == first.id
    assert published() == 1
    other = clone.apply_async(["linux"], fairness_key="bob", idempotency_key="order-17")
    assert other.id != first.id  # per fairness key
    plain = clone.apply_async(["linux"], fairness_key="alice")  # no key: always published
    assert published() == 3
    assert plain.id not in (first.id, other.id)


def test_producers_submitting_at_once_publish_once(producer):
    make, published = producer
    apps = [make() for _ in range(8)]  # eight producers, each its own app and connections
    start = threading.Barrier(len(apps))
    ids: list[str] = []

    def submit(clone) -> None:
        start.wait()
        ids.append(clone.apply_async(["git"], fairness_key="ci", idempotency_key="build-9").id)

    threads = [threading.Thread(target=submit, args=(clone,)) for _, clone in apps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 8
    assert len(set(ids)) == 1
    assert published() == 1


def test_a_publish_that_fails_leaves_the_key_free_for_the_retry(producer):
    make, published = producer
    app, clone = make()

    def fail():
        raise ConnectionError("the broker went away (test)")

    with pytest.raises(ConnectionError):
        submit_once(app, "alice", "order-1", "t-lost", fail, clone.AsyncResult)
    retried = clone.apply_async(["linux"], fairness_key="alice", idempotency_key="order-1")
    assert retried.id != "t-lost"
    assert published() == 1


def test_without_a_shared_store_or_with_a_bad_key_nothing_is_published(producer):
    make, published = producer
    _, alone = make(fair_store_url="memory")
    with pytest.raises(ConfigurationError, match="idempotency_key needs a shared store"):
        alone.apply_async(["linux"], fairness_key="alice", idempotency_key="k")
    _, clone = make()
    with pytest.raises(ConfigurationError, match="non-empty string"):
        clone.apply_async(["linux"], fairness_key="alice", idempotency_key="")
    with pytest.raises(ConfigurationError, match="longer than fair_max_header_length"):
        clone.apply_async(["linux"], fairness_key="alice", idempotency_key="x" * 300)
    assert published() == 0


def test_the_window_is_a_setting(producer):
    make, published = producer
    _, clone = make(fair_idempotency_seconds=0.2)
    first = clone.apply_async(["linux"], fairness_key="alice", idempotency_key="k")
    from harness import wait_until

    def published_again() -> bool:
        again = clone.apply_async(["linux"], fairness_key="alice", idempotency_key="k")
        return again.id != first.id

    wait_until(published_again, 10, "the record to lapse")
    assert published() == 2
