"""What the producer side publishes, read back from Kombu's in-memory transport."""

from __future__ import annotations

import json

import pytest
from celery import Celery, chain, group

from celery_fair import (
    ConfigurationError,
    FairTask,
    MessageError,
    SchedulerError,
    fair_headers,
    fair_router,
    fair_task,
    send,
)
from celery_fair.api import declared_types
from celery_fair.core import Aging
from celery_fair.routing import shard_of


@pytest.fixture
def app():
    app = Celery("t", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = "q"
    app.conf.fair_shards = 1  # the headers, all in q (test_routing.py: the shards)
    yield app
    app.close()


def published(app, n=1):
    """Drain ``n`` raw messages from queue q and return their headers."""
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue("q")
        out = [queue.get(timeout=1).headers for _ in range(n)]
        queue.close()
    return out


def make_clone(app):
    @fair_task(app=app, type="sync-clone", priority=8, conflict_group="git", default_cost=10)
    def clone(repo):
        return repo

    return clone


def test_apply_async_carries_fairness_key_job_id_type_and_submission_time(app):
    clone = make_clone(app)
    clone.apply_async(["linux"], fairness_key="10.0.0.7", job_id="linux")
    (h,) = published(app)
    assert (h["fairness_key"], h["job_id"], h["job_type"]) == ("10.0.0.7", "linux", "sync-clone")
    assert isinstance(h["fair_submitted"], float)


def test_fluent_form_and_delay(app):
    clone = make_clone(app)
    clone.fair(fairness_key="k", job_id="git").delay("git")
    (h,) = published(app)
    assert (h["fairness_key"], h["job_id"]) == ("k", "git")


def test_canvas_primitives_keep_the_headers(app):
    clone = make_clone(app)
    group(
        clone.s("a").set(fairness_key="k1", job_id="a"),
        clone.s("b").set(fairness_key="k2", job_id="b"),
    ).apply_async()
    chain(clone.s("c").set(fairness_key="k3", job_id="c"), clone.s()).apply_async()
    keys = sorted(h.get("fairness_key") for h in published(app, 3))
    assert keys == ["k1", "k2", "k3"]


def test_a_jobs_own_priority_travels_in_fair_priority_and_a_bad_one_publishes_nothing(app):
    app.conf.fair_tier_caps = {9: 1, 3: 3}  # tiers of their own, beside the type's 8
    clone = make_clone(app)
    clone.apply_async(["a"], fairness_key="k", fair_priority=9)
    clone.fair("k", "b", priority=3).delay("b")
    app.send_task("clone", ["c"], headers=fair_headers("sync-clone", "k", "c", priority=5))
    assert [h.get("fair_priority") for h in published(app, 3)] == [9, 3, 5]
    for bad in (0, 1.5, True, "9"):
        with pytest.raises(SchedulerError, match="priority must be a positive int"):
            clone.apply_async(["x"], fair_priority=bad)
        with pytest.raises(SchedulerError, match="priority must be a positive int"):
            fair_headers("sync-clone", priority=bad)
    clone.apply_async(["d"])  # the queue holds only this one: nothing of the bad ones
    (h,) = published(app)
    assert "fair_priority" not in h


def test_a_priority_no_type_or_tier_declares_is_refused_and_publishes_nothing(app):
    app.conf.fair_tier_caps = {9: 1}
    clone = make_clone(app)

    @fair_task(app=app, type="gc", priority=2)
    def gc(): ...

    for declared in (8, 9, 2):  # the type's, a fair_tier_caps tier, another type's
        clone.apply_async(["ok"], fair_priority=declared)
    assert [h["fair_priority"] for h in published(app, 3)] == [8, 9, 2]
    with pytest.raises(SchedulerError, match=r"priority 1000000000 is not declared.*2, 8, 9"):
        clone.apply_async(["x"], fair_priority=10**9)
    with pytest.raises(SchedulerError, match="priority 5 is not declared"):
        clone.fair("k", "x", priority=5).delay("x")
    clone.apply_async(["d"])  # the queue holds only this one: nothing of the refused ones
    (h,) = published(app)
    assert "fair_priority" not in h


def test_a_header_that_is_not_unicode_text_is_refused_and_nothing_is_published_or_recorded(app):
    app.conf.fair_shards = 8  # the shard hash would meet the key first
    app.conf.fair_track_submits = True  # and the store would record it
    clone = make_clone(app)
    lone = json.loads('"\\ud800"')
    attempts = [
        lambda: clone.apply_async(["x"], fairness_key=f"tenant-{lone}"),
        lambda: clone.apply_async(["x"], fairness_key="k", job_id=lone),
        lambda: clone.apply_async(["x"], headers={"fairness_key": lone}),
        lambda: clone.apply_async(["x"], fairness_key="k", task_id=lone),
        lambda: clone.apply_async(["x"], fairness_key=lone, idempotency_key="once"),
        lambda: clone.fair(lone, "linux").delay("x"),
        lambda: fair_headers("sync-clone", lone, "linux"),
        lambda: fair_headers("sync-clone", "k", lone),
    ]
    for attempt in attempts:
        with pytest.raises(MessageError, match="not Unicode text"):
            attempt()
    app.conf.task_routes = [fair_router(app)]
    with pytest.raises(MessageError, match="fairness_key is not Unicode text"):
        app.send_task("clone", ["x"], headers={"fairness_key": lone, "job_type": "sync-clone"})
    with app.connection_for_read() as conn:
        assert all(conn.SimpleQueue(q).qsize() == 0 for q in ["q", *shard_queues(8)])


def shard_queues(n):
    return [f"q.fair.{i}" for i in range(n)]


def test_plain_producers_use_send_task_with_fair_headers(app):
    app.send_task("clone", ["x"], headers=fair_headers("sync-clone", "k", "x", submitted=5.0))
    (h,) = published(app)
    assert (h["job_type"], h["fairness_key"], h["job_id"], h["fair_submitted"]) == (
        "sync-clone",
        "k",
        "x",
        5.0,
    )


def test_job_type_defaults_to_the_task_name_and_several_tasks_share_a_type(app):
    @fair_task(app=app, name="t.a", type="shared", priority=4)
    def a(): ...

    @fair_task(app=app, name="t.b", type="shared")
    def b(): ...

    @fair_task(app=app, name="t.c", priority=2)
    def c(): ...

    types = declared_types(app, {})
    assert set(types) == {"shared", "t.c"}
    assert types["shared"].priority == 4


def test_a_type_declared_twice_differently_is_a_configuration_error(app):
    @fair_task(app=app, name="t.a", type="shared", priority=4)
    def a(): ...

    @fair_task(app=app, name="t.b", type="shared", priority=8)
    def b(): ...

    with pytest.raises(ConfigurationError, match="declared twice"):
        declared_types(app, {})


def test_a_fair_task_declares_its_types_rate_and_a_bad_one_names_the_task(app):
    @fair_task(app=app, name="t.export", type="export", priority=4, rate="120/m", burst=5)
    def export(): ...

    @app.task(base=FairTask, fair_type="hook", fair_priority=4, fair_rate=3, name="t.hook")
    def hook(): ...

    types = declared_types(app, {})
    assert (types["export"].rate, types["export"].burst, types["export"].per) == (2.0, 5.0, "job")
    assert types["hook"].rate == 3.0

    @fair_task(app=app, name="t.bad", type="bad", priority=4, rate="fast", per="cost")
    def bad(): ...

    with pytest.raises(ConfigurationError, match=r"task 't\.bad'.*rate must be like"):
        declared_types(app, {})


def test_a_type_nobody_declares_is_a_configuration_error(app):
    @fair_task(app=app, name="t.a", type="orphan")
    def a(): ...

    with pytest.raises(ConfigurationError, match="orphan"):
        declared_types(app, {})


def test_base_class_form(app):
    @app.task(base=FairTask, fair_type="snap", fair_priority=4, name="t.snap")
    def snap(): ...

    assert declared_types(app, {})["snap"].priority == 4
    snap.apply_async(fairness_key="k")
    assert published(app)[0]["job_type"] == "snap"


def test_a_task_may_declare_how_its_type_ages(app):
    @fair_task(app=app, type="rescan", priority=1, aging={"interval": 10, "urgent": 8})
    def rescan(bucket):
        return bucket

    jtype = rescan.declared_job_type()
    assert jtype.aging == Aging(interval=10, urgent_threshold=8)


@pytest.mark.parametrize("inherit", [False, True])
def test_a_retry_and_with_inherit_aging_a_child_keep_the_callers_aging_clock(app, inherit):
    app.conf.fair_inherit_aging = inherit  # (read once per app, at its first publish)
    clone = make_clone(app)

    @fair_task(app=app, type="parent", priority=4)
    def parent():
        clone.apply_async(["child"], fairness_key="k")
        clone.apply_async(["retry"], fairness_key="k", retries=1, task_id="same")

    parent.apply(headers={"fair_submitted": 1000.0})  # runs here, with its headers
    child, retry = published(app, 2)
    assert retry["fair_submitted"] == 1000.0  # a retry goes on with its own clock
    # A new job starts its own, unless it inherits its caller's.
    assert (child["fair_submitted"] == 1000.0) is inherit


def test_send_publishes_by_name_with_the_fair_headers_and_refuses_what_apply_async_refuses(app):
    # A producer without the task's code names the type; one that has it gets its type.
    send(app, "repos.clone", ["x"], job_type="sync-clone", fairness_key="k", job_id="x")
    send(app, make_clone(app).name, ["y"], fairness_key="k2")
    first, second = published(app, 2)
    assert (first["job_type"], first["fairness_key"], first["job_id"]) == ("sync-clone", "k", "x")
    assert isinstance(first["fair_submitted"], float)
    assert (second["job_type"], second["fairness_key"]) == ("sync-clone", "k2")
    # What a fair task refuses, send refuses before publishing anything.
    lone = json.loads('"\\ud800"')
    with pytest.raises(SchedulerError):
        send(app, "repos.clone", ["z"], job_type="sync-clone", fair_priority=3)
    with pytest.raises(MessageError, match="not Unicode text"):
        send(app, "repos.clone", ["z"], job_type="sync-clone", fairness_key=lone)
    with pytest.raises(MessageError, match="not Unicode text"):
        send(app, "repos.clone", ["z"], job_type=lone)
    with app.connection_for_read() as conn:
        assert conn.SimpleQueue("q").qsize() == 0


def test_send_goes_to_its_keys_shard_as_a_fair_task_does(app):
    app.conf.fair_shards = 8
    send(app, "repos.clone", ["x"], job_type="sync-clone", fairness_key="tenant-7")
    found = {}
    with app.connection_for_read() as conn:  # drained: the in-memory broker is the process's
        for name in ["q", *shard_queues(8)]:
            queue = conn.SimpleQueue(name)
            while queue.qsize():
                queue.get(timeout=1).ack()
                found[name] = found.get(name, 0) + 1
            queue.close()
    assert found == {f"q.fair.{shard_of('tenant-7', 8)}": 1}
