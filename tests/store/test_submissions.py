"""Idempotent submits (submissions.py) from real producers on the real Redis: a duplicate of
(fairness key, idempotency key) publishes nothing and gets the first task id."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import kombu.exceptions
import pytest
import redis
from celery import Celery
from celery.signals import before_task_publish
from shared_redis import REDIS_URL

from celery_fair import QueueFull, fair_task
from celery_fair.errors import ConfigurationError, StoreUnavailable, SubmissionPending
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
            {
                "fair_store_prefix": prefix,
                "fair_shards": 1,
                "broker_transport_options": {"global_keyprefix": f"{prefix}:"},
                **conf,
            }
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


# -- the matrix: nothing records a submission that was not published (issue 31, item 2) ------

REFUSING = "redis://127.0.0.1:1/0"  # nothing listens there: every connection is refused
LIMITS = {  # the producer's settings for each column, and whether the limit is reached
    "untracked": {},
    "tracked": {"fair_track_submits": True},
    "key limit reached": {"fair_max_queued_per_key": 1},
    "total limit reached": {"fair_max_queued": 1},
}


@pytest.fixture
def records(producer):
    """What the store says about the matrix's submission of key "alice": its idempotency
    record, the tracked task ids, and alice's count of ended submissions."""
    make, _ = producer
    app, _ = make()
    prefix = app.conf.fair_store_prefix
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)

    def read(idempotency_key: str | None) -> tuple[str | None, set[str], str | None]:
        record = None
        if idempotency_key is not None:
            field = f"5:alice{idempotency_key}"
            record = client.get(f"{{{prefix}}}:submitted:{field}")
            pending = client.get(f"{{{prefix}}}:submitting:{field}")
            assert pending is None, "a submit that has returned left its record pending"
        tracked = set(client.zrange(f"{{{prefix}}}:queued_by_time", 0, -1))
        return record, tracked, client.hget(f"{{{prefix}}}:queued_rate", "alice")

    yield read
    client.close()


@pytest.mark.parametrize("fault", ["none", "the publish fails", "the store is unreachable"])
@pytest.mark.parametrize("on_full", ["raise", "return"])
@pytest.mark.parametrize("limit", list(LIMITS))
@pytest.mark.parametrize("idempotency_key", [None, "order-1"])
def test_no_record_claims_a_submission_that_was_not_published(
    producer, records, idempotency_key, limit, on_full, fault
):
    make, published = producer
    conf = {**LIMITS[limit], "fair_on_queue_full": on_full}
    healthy_app, healthy = make(**conf)
    # Given (for a limit) one job already submitted that fills it,
    filler = []
    if limit == "key limit reached":
        filler = [healthy.apply_async(["filler"], fairness_key="alice").id]
    elif limit == "total limit reached":
        filler = [healthy.apply_async(["filler"], fairness_key="bob").id]
    before = published()
    # when alice submits through a producer whose broker refuses connections, or whose store
    # cannot be reached,
    faulty = dict(conf)
    if fault == "the publish fails":
        faulty.update(broker_url=REFUSING, fair_store_url=REDIS_URL)
        faulty["broker_transport_options"] = {}
    elif fault == "the store is unreachable":
        faulty["fair_store_url"] = REFUSING
    _, clone = make(**faulty)
    uses_store = idempotency_key is not None or limit != "untracked"
    try:
        outcome: object = clone.apply_async(
            ["linux"], fairness_key="alice", idempotency_key=idempotency_key
        )
    except Exception as exc:
        outcome = exc
    # then the outcome is the one the settings promise,
    if fault == "the store is unreachable" and uses_store:
        assert isinstance(outcome, StoreUnavailable), outcome
    elif limit.endswith("reached"):
        assert isinstance(outcome, QueueFull), outcome
        if on_full == "raise":
            assert outcome.__traceback__ is not None  # it was raised, not returned
        else:
            assert outcome.__traceback__ is None
    elif fault == "the publish fails":
        assert isinstance(outcome, kombu.exceptions.OperationalError), outcome
    else:
        assert hasattr(outcome, "id"), outcome
    handle = getattr(outcome, "id", None)
    # and the store records exactly what was published: an idempotency record and a tracked
    # entry only for a published submit, and no end counted for one that never was.
    record, tracked, ended = records(idempotency_key)
    assert published() == before + (1 if handle else 0)
    assert record == (handle if idempotency_key is not None else None)
    tracks = limit != "untracked"
    assert tracked == set(filler) | ({handle} if handle and tracks else set())
    assert ended is None
    if handle:
        return
    # Once there is room and nothing fails any more, the same submit publishes a job,
    if filler:
        tracked_store(healthy_app).untrack(filler)
    again = healthy.apply_async(["linux"], fairness_key="alice", idempotency_key=idempotency_key)
    assert hasattr(again, "id"), again
    assert published() == before + 1
    # and a duplicate of it gets its id and publishes nothing.
    if idempotency_key is not None:
        dup = healthy.apply_async(["linux"], fairness_key="alice", idempotency_key=idempotency_key)
        assert dup.id == again.id
        assert published() == before + 1


# -- duplicates learn the first submit's outcome (issue 31, item 4) --------------------------

BROKER_UP = {"redis": REDIS_URL, "amqp": "amqp://guest:guest@127.0.0.1:5672//"}
BROKER_DOWN = {"redis": REFUSING, "amqp": "amqp://guest:guest@127.0.0.1:1//"}

# A producer process: its own app on the given broker and store prefix; at the agreed moment
# it submits once with idempotency key "order-1" and prints what it got.
PRODUCER = """
import json, sys, time
from celery import Celery
from celery_fair import fair_task
broker, store, prefix, queue, at = sys.argv[1:6]
app = Celery(broker=broker, set_as_current=False)
app.conf.update(fair_store_url=store, fair_store_prefix=prefix, fair_shards=1,
                task_default_queue=queue)

@fair_task(app=app, name="t.clone", type="clone")
def clone(repo):
    return repo

while time.time() < float(at):
    time.sleep(0.001)
try:
    print(json.dumps({"id": clone.apply_async(["linux"], fairness_key="alice",
                                              idempotency_key="order-1").id}))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__}))
"""


@pytest.fixture
def submitters():
    """``submit_at_once(broker_url, threads, processes)``: that many producers (threads of this
    process, each with its own app, and processes) submit the same idempotent job at the same
    moment; what each got, ``{"id": ...}`` or ``{"error": name}``; then ``published(url)`` and
    ``record()``, the store's published record."""
    prefix = f"test-dup-{uuid.uuid4().hex[:10]}"
    queue = f"{prefix}-q"
    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    apps: list[Celery] = []

    def make(broker: str) -> Any:
        app = Celery(broker=broker, set_as_current=False)
        app.conf.update(
            fair_store_url=REDIS_URL, fair_store_prefix=prefix, fair_shards=1,
            task_default_queue=queue,
        )  # fmt: skip

        @fair_task(app=app, name="t.clone", type="clone")
        def clone(repo: str) -> str:
            return repo

        apps.append(app)
        return clone

    def submit_at_once(broker: str, threads: int, processes: int) -> list[dict[str, str]]:
        at = time.time() + 2.0  # long after every process has started
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", PRODUCER, broker, REDIS_URL, prefix, queue, repr(at)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(processes)
        ]
        outcomes: list[dict[str, str]] = []
        clones = [make(broker) for _ in range(threads)]

        def submit(clone: Any) -> None:
            while time.time() < at:
                time.sleep(0.001)
            try:
                got = clone.apply_async(["linux"], fairness_key="alice", idempotency_key="order-1")
                outcomes.append({"id": got.id})
            except Exception as exc:
                outcomes.append({"error": type(exc).__name__})

        running = [threading.Thread(target=submit, args=(c,)) for c in clones]
        for t in running:
            t.start()
        for t in running:
            t.join()
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0, err
            outcomes.append(json.loads(out))
        return outcomes

    def published(broker: str) -> int:
        with Celery(broker=broker, set_as_current=False).connection_for_write() as conn:
            try:
                _, count, _ = conn.default_channel.queue_declare(queue, passive=True)
            except conn.channel_errors:  # RabbitMQ: 404, no such queue
                return 0
        return int(count)

    def record() -> tuple[str | None, str | None]:
        field = "5:aliceorder-1"
        return (
            client.get(f"{{{prefix}}}:submitted:{field}"),
            client.get(f"{{{prefix}}}:submitting:{field}"),
        )

    yield submit_at_once, make, published, record
    for app in apps:
        app.close()
    for key in client.scan_iter(match=f"{{{prefix}}}:*", count=1000):
        client.delete(key)
    with Celery(broker=BROKER_UP["amqp"], set_as_current=False).connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
    client.delete(queue)  # the Redis broker's list
    client.close()


@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_duplicates_submitted_while_the_broker_is_down_get_no_handle_to_a_job(submitters, broker):
    submit_at_once, make, published, record = submitters
    # Given a broker that refuses connections, when four threads and four processes submit
    # the same (fairness key, idempotency key) at once,
    outcomes = submit_at_once(BROKER_DOWN[broker], threads=4, processes=4)
    # then none gets a task id (there is no job): each publish failed, or the submit said
    # that the first one's outcome is not known yet,
    assert len(outcomes) == 8
    assert all(o.get("error") in ("OperationalError", "SubmissionPending") for o in outcomes), (
        outcomes
    )
    # and the store records nothing, so once the broker is back the retry publishes,
    assert record() == (None, None)
    clone = make(BROKER_UP[broker])
    first = clone.apply_async(["linux"], fairness_key="alice", idempotency_key="order-1")
    assert published(BROKER_UP[broker]) == 1
    # and every duplicate from then on gets its id.
    outcomes = submit_at_once(BROKER_UP[broker], threads=2, processes=2)
    assert outcomes == [{"id": first.id}] * 4
    assert published(BROKER_UP[broker]) == 1


@pytest.mark.parametrize("broker", ["redis", "amqp"])
def test_duplicates_submitted_at_once_while_the_broker_is_up_share_one_published_job(
    submitters, broker
):
    submit_at_once, _, published, record = submitters
    outcomes = submit_at_once(BROKER_UP[broker], threads=4, processes=4)
    ids = {o.get("id") for o in outcomes}
    assert len(outcomes) == 8
    assert len(ids) == 1, outcomes
    assert None not in ids, outcomes
    assert published(BROKER_UP[broker]) == 1
    assert record() == (ids.pop(), None)


def test_a_duplicate_of_a_submit_still_publishing_waits_for_it_or_says_it_is_not_known(
    producer,
):
    make, published = producer
    app, clone = make(fair_idempotency_wait_seconds=0.3)
    store = tracked_store(app)
    # Given a producer that has claimed the key and not published yet (it hangs, say),
    assert store.claim_submission("alice", "order-1", "t-first", 60.0) is None
    # a duplicate waits for its outcome, then says it is not known: no handle, nothing sent.
    with pytest.raises(SubmissionPending, match="not known"):
        clone.apply_async(["linux"], fairness_key="alice", idempotency_key="order-1")
    assert published() == 0
    # Once the first publishes, a duplicate that waits for it gets its handle;
    seen: list[str] = []
    waiting = threading.Thread(
        target=lambda: seen.append(
            make(fair_idempotency_wait_seconds=30)[1]
            .apply_async(["linux"], fairness_key="alice", idempotency_key="order-1")
            .id
        )
    )
    waiting.start()
    clone.apply_async(["linux"], task_id="t-first", fairness_key="alice")  # its publish
    assert store.confirm_submission("alice", "order-1", "t-first", 3600.0)
    waiting.join(timeout=30)
    assert seen == ["t-first"]
    # and once a first submit gives up (its publish failed), the waiting duplicate publishes.
    assert store.claim_submission("alice", "order-2", "t-failing", 60.0) is None
    waiting = threading.Thread(
        target=lambda: seen.append(
            make(fair_idempotency_wait_seconds=30)[1]
            .apply_async(["linux"], fairness_key="alice", idempotency_key="order-2")
            .id
        )
    )
    waiting.start()
    store.forget_submission("alice", "order-2", "t-failing")
    waiting.join(timeout=30)
    assert len(seen) == 2
    assert seen[1] != "t-failing"
    assert published() == 2


# -- the store dies in the middle of a submit -----------------------------------------------


@pytest.fixture
def dying_store(tmp_path):
    """A redis-server of the test's own on a spare port for the store, and ``die()``, which
    SIGKILLs it (by its PID)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)

    def pings() -> bool:
        try:
            return bool(client.ping())
        except redis.ConnectionError:
            return False

    from harness import wait_until

    wait_until(pings, 10, f"redis-server on port {port}")
    client.close()

    def die(**_: Any) -> None:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)

    yield url, die
    die()


@pytest.mark.parametrize("publish", ["succeeds", "fails"])
@pytest.mark.parametrize("limit", ["untracked", "tracked"])
def test_a_store_lost_between_the_claim_and_the_publish_leaves_the_publish_outcome_intact(
    producer, dying_store, caplog, publish, limit
):
    make, published = producer
    url, die = dying_store
    conf = {**LIMITS[limit], "fair_store_url": url}
    if publish == "fails":
        conf.update(broker_url=REFUSING, broker_transport_options={})
    _, clone = make(**conf)
    # Given a store that dies once the submit has claimed its key (and tracked it), just
    # before the message is published (Celery's before_task_publish signal),
    before_task_publish.connect(die, weak=False, dispatch_uid="test-dying-store")
    try:
        outcome: object = clone.apply_async(["linux"], fairness_key="alice", idempotency_key="k")
    except Exception as exc:
        outcome = exc
    finally:
        before_task_publish.disconnect(dispatch_uid="test-dying-store")
    # the caller learns what happened to its publish (not the store's trouble): a published
    # job's handle (a StoreUnavailable would make it submit again), or the broker's error;
    # the records it could not update are left to lapse, with a warning.
    if publish == "succeeds":
        assert hasattr(outcome, "id"), outcome
        assert published() == 1
        assert "could not be confirmed" in caplog.text
    else:
        assert isinstance(outcome, kombu.exceptions.OperationalError), outcome
        assert "could not drop the pending record" in caplog.text
        if limit == "tracked":
            assert "could not withdraw the tracked entry" in caplog.text
