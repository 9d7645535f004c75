"""The store behind Redis Sentinel: found through the Sentinel, and through a failover.

The contract and engine suites run on a Sentinel group too (the ``sentinel`` kind in
conftest.py). Here: the URL forms, what the store does when its master dies and the Sentinel
promotes the replica, and that a replica's READONLY answer makes the store connect anew.
"""

from __future__ import annotations

import uuid

import pytest
import redis
from celery import Celery
from harness import Run, Worker, intervals, max_overlap, wait_until
from test_contract import ask, verdicts
from test_link import RecordingLoop, _admit_one, _answered

from celery_fair import fair_headers
from celery_fair.errors import ConfigurationError, StoreUnavailable
from celery_fair.settings import FairSettings
from celery_fair.store import Done, RedisStore, Verdict
from celery_fair.worker.bootstep import open_store, store_url
from celery_fair.worker.link import StoreLink
from redis_cluster import HOST
from redis_sentinel import MASTER_NAME, running_sentinel


def prefix() -> str:
    return f"test-sentinel-{uuid.uuid4().hex[:8]}"


def test_the_store_works_on_the_master_the_sentinel_names(sentinel):
    p = prefix()
    store = RedisStore.from_url(sentinel.url(db=2), prefix=p)
    try:
        assert StoreLink.supports(store)  # one server: the worker's non-blocking link drives it
        reply = store.admit("w1", [ask("a", type_cap=1), ask("b", type_cap=1)])
        assert verdicts(reply) == [Verdict.ADMITTED, Verdict.TYPE_CAP]
        with redis.Redis(host=HOST, port=sentinel.master_port(), db=2) as master:
            assert master.exists(f"{{{p}}}:jobs")
    finally:
        store.close()


def test_a_worker_on_a_sentinel_broker_keeps_its_state_on_that_master(sentinel):
    # The default store follows the broker: its Sentinels, and the master's name from
    # broker_transport_options.
    # As in Kombu, the database (and any password) comes from the first URL.
    app = Celery("t", broker=f"sentinel://{HOST}:1/3;sentinel://{HOST}:{sentinel.sentinel_port}")
    app.conf.broker_transport_options = {"master_name": MASTER_NAME}
    settings = FairSettings.from_mapping({"fair_store_prefix": prefix()})
    assert store_url(settings, app) == (
        f"sentinel://{HOST}:1/3;sentinel://{HOST}:{sentinel.sentinel_port}"
        f"?master_name={MASTER_NAME}"
    )
    store = open_store(settings, app)  # the first Sentinel (port 1) is down: the next answers
    assert store is not None
    try:
        assert verdicts(store.admit("w1", [ask("a")])) == [Verdict.ADMITTED]
        with redis.Redis(host=HOST, port=sentinel.master_port(), db=3) as master:
            assert master.exists(f"{{{settings.store_prefix}}}:jobs")
    finally:
        store.close()


@pytest.mark.parametrize(
    ("url", "complaint"),
    [
        (f"sentinel://{HOST}:26379/0", "needs the master's name"),
        (f"sentinel://{HOST}:26379/x?master_name=m", "must be a number"),
        (f"sentinel://{HOST}:26379;redis://{HOST}:6379?master_name=m", "starts sentinel://"),
    ],
)
def test_a_sentinel_url_that_cannot_work_is_refused_saying_why(url, complaint):
    with pytest.raises(ConfigurationError, match=complaint):
        RedisStore.from_url(url)


def test_after_the_master_dies_the_store_follows_the_promoted_replica(tmp_path_factory):
    with running_sentinel(tmp_path_factory) as group:
        store = RedisStore.from_url(group.url(), prefix=prefix(), lease=60)
        try:
            first = store.admit("w1", [ask("a", type_cap=2)]).grants[0]
            assert first.verdict is Verdict.ADMITTED
            old = group.master_port()
            with group.node(old) as master:  # the admission has reached the replica
                assert master.execute_command("WAIT", 1, 5000) == 1
            group.kill(old)

            def admitted_after_failover():
                try:
                    return store.admit("w1", [ask("b", type_cap=2), ask("c", type_cap=2)])
                except StoreUnavailable:  # until the Sentinel has promoted the replica
                    return None

            reply = wait_until(admitted_after_failover, 30, "an admission after the failover")
            assert group.master_port() != old
            # "a" still holds its slot on the new master: one more fits under the cap of 2.
            assert verdicts(reply) == [Verdict.ADMITTED, Verdict.TYPE_CAP]
            done = store.finish("w1", [Done("a", first.token, 0.1, final=True)])
            assert [f.applied for f in done] == [True]
        finally:
            store.close()


@pytest.fixture
def replica(sentinel):
    """A plain store pointed at the group's replica, as a worker is after a failover when its
    old master comes back as a replica."""
    master = sentinel.master_port()
    port = next(p for p in sentinel.ports[:2] if p != master)
    store = RedisStore(redis.Redis(host=HOST, port=port, socket_timeout=5), prefix())
    yield store
    store.close()


def test_a_replicas_readonly_answer_is_an_outage_and_drops_the_connection(replica):
    with pytest.raises(StoreUnavailable, match="READONLY"):
        replica.admit("w1", [ask("a")])
    assert replica._wire is not None
    assert replica._wire.conn is None


def test_the_links_readonly_answer_is_an_outage_and_drops_the_connection(replica):
    loop, delivered = RecordingLoop(), []
    link = StoreLink(replica, loop, lambda call, result: delivered.append(result))
    link.submit(_admit_one("a"))
    (on_readable,) = loop.readers.values()
    wait_until(lambda: _answered(loop), 10, "the replica's answer")
    on_readable()
    assert isinstance(delivered[0], StoreUnavailable)
    assert "READONLY" in str(delivered[0])
    assert loop.readers == {}  # the socket is gone from the loop; the next call connects anew
    link.close()


def test_fair_workers_on_a_sentinel_broker_share_their_state_on_its_master(sentinel, tmp_path):
    # Two real workers whose broker is the Sentinel group: the store follows the broker there
    # (no fair_store_url), so a conflict holds across both and nothing stays counted after.
    run = Run("redis", conf={"broker_transport_options": {"master_name": MASTER_NAME}})
    run.url = f"sentinel://{HOST}:{sentinel.sentinel_port}/6"
    workers = [Worker(run, log_dir=tmp_path).start(60) for _ in range(2)]
    try:
        for i in range(6):
            run.send("fairapp.clone", f"linux{i}", 0.1, headers=fair_headers("clone", "k", "linux"))
            run.send("fairapp.clone", f"other{i}", 0.1, headers=fair_headers("clone", "k", f"r{i}"))
        wait_until(lambda: len(run.recorder.done_counts()) == 12, 90, "all 12 jobs")
        spans = intervals(run.recorder.events())
        assert max_overlap([spans[t] for t in spans if t.startswith("linux")]) == 1
        store = RedisStore.from_url(sentinel.url(db=6), prefix=run.prefix)
        try:
            view = store.heartbeat("probe", [], [])
            assert view.workers >= 3  # the two workers and this probe
            assert view.tiers == {}
            assert view.types == {}
        finally:
            store.close()
    finally:
        for worker in workers:
            worker.stop()
        run.recorder.clear()
        run.app.close()


def test_a_store_following_a_sentinel_broker_uses_its_sentinel_kwargs(tmp_path_factory):
    # Sentinels with a password of their own: Kombu takes it from the transport option
    # sentinel_kwargs, and so does the store that follows the broker.
    with running_sentinel(tmp_path_factory, sentinel_password="s3cret") as group:
        app = Celery("t", broker=f"sentinel://{HOST}:{group.sentinel_port}/0")
        options = {"master_name": MASTER_NAME, "sentinel_kwargs": {"password": "s3cret"}}
        app.conf.broker_transport_options = options
        settings = FairSettings.from_mapping({"fair_store_prefix": prefix()})
        store = open_store(settings, app)
        try:
            assert verdicts(store.admit("w1", [ask("a")])) == [Verdict.ADMITTED]
        finally:
            store.close()
        # An explicit URL says it in its query,
        url = f"{group.url()}&sentinel_password=s3cret"
        store = RedisStore.from_url(url, prefix=settings.store_prefix)
        try:
            assert verdicts(store.admit("w1", [ask("b")])) == [Verdict.ADMITTED]
        finally:
            store.close()
        # and without either, the Sentinel refuses: an outage, not a crash.
        app.conf.broker_transport_options = {"master_name": MASTER_NAME}
        store = open_store(settings, app)
        try:
            with pytest.raises(StoreUnavailable):
                store.admit("w1", [ask("c")])
        finally:
            store.close()
