"""Idempotent submits (submissions.py) from real producers on the real Redis: a duplicate of
(fairness key, idempotency key) publishes nothing and gets the first task id."""

from __future__ import annotations

import threading
import uuid

import pytest
import redis
from celery import Celery
from shared_redis import REDIS_URL

from celery_fair import QueueFull, fair_task
from celery_fair.errors import ConfigurationError, StoreUnavailable
from celery_fair.submissions import submit_once, submit_tracked, tracked_store


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
    with pytest.raises(ConfigurationError, match="tracked submissions need a shared store"):
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


def test_a_tracked_submit_with_the_store_unreachable_publishes_nothing(producer):
    make, published = producer
    _, clone = make(fair_track_submits=True, fair_store_url="redis://127.0.0.1:1/0")
    with pytest.raises(StoreUnavailable):
        clone.apply_async(["linux"], fairness_key="alice")
    assert published() == 0


def test_a_tracked_publish_that_fails_is_forgotten_and_a_duplicate_is_tracked_once(producer):
    make, published = producer
    app, clone = make(fair_max_queued_per_key=2)

    def fail():
        raise ConnectionError("the broker went away (test)")

    with pytest.raises(ConnectionError):
        submit_tracked(app, "alice", "t-lost", fail, lambda store: 1.0)
    store = tracked_store(app)
    assert store.queued("t-lost") is None
    first = clone.apply_async(["linux"], fairness_key="alice", idempotency_key="k")
    clone.apply_async(["linux"], fairness_key="alice", idempotency_key="k")  # the duplicate
    assert store.queued(first.id).in_key == 1
    clone.apply_async(["git"], fairness_key="alice")
    with pytest.raises(QueueFull):
        clone.apply_async(["hg"], fairness_key="alice")
    assert published() == 2


def test_producers_submitting_at_once_stop_at_the_limit(producer):
    make, published = producer
    apps = [make(fair_max_queued_per_key=5) for _ in range(8)]
    start = threading.Barrier(len(apps))
    outcomes: list[str] = []

    def submit(clone) -> None:
        start.wait()
        for _ in range(3):
            try:
                clone.apply_async(["git"], fairness_key="ci")
                outcomes.append("published")
            except QueueFull:
                outcomes.append("refused")

    threads = [threading.Thread(target=submit, args=(clone,)) for _, clone in apps]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("published") == 5
    assert outcomes.count("refused") == 19
    assert published() == 5
