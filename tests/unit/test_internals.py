"""The Celery internals the gate relies on (worker/internals.py), checked on the installed
Celery: a pool call names its request, whichever request class Celery builds."""

from __future__ import annotations

import pytest
from celery import Celery
from celery.contrib.testing.mocks import TaskMessage
from celery.worker import state as worker_state
from celery.worker.request import Request, create_request_cls

from celery_fair.worker.headers import request_uid
from celery_fair.worker.internals import (
    already_revoked,
    ends_on_loop,
    pool_size,
    request_of,
    revoked_marker,
)


class Pool:
    """Records what ``Request.execute_using_pool`` passes to the pool."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def apply_async(self, target, args=None, kwargs=None, **options):
        self.calls.append(options)


@pytest.fixture
def app():
    app = Celery(set_as_current=False)

    @app.task(name="t.add", shared=False)
    def add(x, y):
        return x + y

    yield app
    app.close()


@pytest.mark.parametrize("kind", ["Request", "create_request_cls"])
def test_a_pool_call_names_its_request_even_when_two_share_a_task_id(app, kind):
    task, pool = app.tasks["t.add"], Pool()
    cls = Request
    if kind == "create_request_cls":  # the class Celery's default strategy builds
        cls = create_request_cls(Request, task, pool, "host", None, app=app)
    first, second = (
        cls(TaskMessage("t.add", id="same", args=(1, 2)), app=app, task=task) for _ in range(2)
    )
    for req in (first, second):
        req.execute_using_pool(pool)
    assert [request_of(options) for options in pool.calls] == [first, second]
    assert request_of({"callback": None, "correlation_id": "same"}) is None


def test_a_request_celery_found_revoked_is_seen_as_revoked(app):
    task = app.tasks["t.add"]
    req = Request(TaskMessage("t.add", id="gone"), app=app, task=task)
    assert not already_revoked(req)
    worker_state.revoked.add("gone")
    try:
        assert req.revoked()  # Celery acks it and will never hand it to the pool
    finally:
        worker_state.revoked.discard("gone")
    assert already_revoked(req)


def test_a_replacement_and_a_retry_are_other_jobs_than_the_task_they_follow():
    first = request_uid("abc", {"retries": 0, "replaced_task_nesting": 0})
    retry = request_uid("abc", {"retries": 1})
    replacement = request_uid("abc", {"retries": 0, "replaced_task_nesting": 1})
    assert len({first, retry, replacement}) == 3
    assert request_uid("abc", {}) == first == "abc"


def test_pool_size_and_which_pools_end_jobs_on_the_loop():
    from celery.concurrency.prefork import TaskPool as Prefork
    from celery.concurrency.solo import TaskPool as Solo
    from celery.concurrency.thread import TaskPool as Threads

    prefork, threads, solo = Prefork(limit=3), Threads(limit=5), Solo()
    try:
        assert pool_size(prefork) == 3  # before its processes exist
        assert pool_size(threads) == 5
        assert [ends_on_loop(p) for p in (prefork, threads, solo)] == [True, True, False]
    finally:
        threads.on_stop()


def test_the_revoked_marker_moves_with_every_revoke():
    before = revoked_marker()
    worker_state.revoked.add("marker-test")
    try:
        assert revoked_marker() != before
    finally:
        worker_state.revoked.discard("marker-test")
