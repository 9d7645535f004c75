"""Fair shard queues (routing.py): where the producer side publishes, read back from Kombu's
in-memory transport, and what a fair worker consumes."""

from __future__ import annotations

import collections
import os
import subprocess
import sys

import pytest
from celery import Celery
from kombu import Exchange, Queue

from celery_fair import fair_headers, fair_router, fair_task
from celery_fair.errors import ConfigurationError
from celery_fair.routing import (
    Shards,
    base_name,
    consume_shards,
    shard_index,
    shard_name,
    shard_of,
)
from celery_fair.settings import FairSettings

SHARDS = 8


@pytest.fixture
def app():
    app = Celery("t", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = "q"
    yield app
    app.close()


def clone_task(app, **options):
    @fair_task(app=app, type="clone", priority=8, **options)
    def clone(repo):
        return repo

    return clone


def where(app, *queues):
    """Which of ``queues`` hold a message now, and how many each (drained)."""
    found = {}
    with app.connection_for_read() as conn:
        for name in queues:
            queue = conn.SimpleQueue(name)
            n = 0
            while queue.qsize():
                queue.get(timeout=1).ack()
                n += 1
            queue.close()
            if n:
                found[name] = n
    return found


def all_of(base):
    return [base, *(shard_name(base, i) for i in range(SHARDS))]


def test_the_shard_of_a_key_is_the_same_in_every_process():
    keys = ["10.0.0.7", "", "client-ü", "a" * 300]
    code = f"from celery_fair.routing import shard_of; print([shard_of(k, 8) for k in {keys!r}])"
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert seen == {f"{[shard_of(k, 8) for k in keys]}\n"}


def test_keys_spread_evenly_over_the_shards():
    counts = collections.Counter(shard_of(f"client-{i}", SHARDS) for i in range(8000))
    assert set(counts) == set(range(SHARDS))
    assert max(counts.values()) < 1.1 * min(counts.values())


def test_shard_names_and_their_base():
    assert shard_name("q", 3) == "q.fair.3"
    assert (shard_index("q.fair.3"), base_name("q.fair.3")) == (3, "q")
    assert (shard_index("q.fair.x"), base_name("q.fair.x")) == (None, "q.fair.x")
    assert (shard_index("q"), base_name("q")) == (None, "q")


def test_a_fair_job_with_a_key_goes_to_its_keys_shard_and_one_without_to_the_queue(app):
    clone = clone_task(app)
    clone.apply_async(["linux"], fairness_key="10.0.0.7")
    clone.apply_async(["git"])  # background work: no key
    assert where(app, *all_of("q")) == {shard_name("q", shard_of("10.0.0.7", SHARDS)): 1, "q": 1}


def test_a_retry_published_to_its_shard_stays_there(app):
    clone = clone_task(app)
    shard = shard_name("q", shard_of("k", SHARDS))
    clone.apply_async(["linux"], fairness_key="k", queue=shard)  # as Task.retry publishes
    assert where(app, *all_of("q")) == {shard: 1}


def test_the_shard_is_of_the_queue_the_task_is_routed_to(app):
    app.conf.task_routes = {"*.clone": {"queue": "git"}}
    clone = clone_task(app)
    clone.apply_async(["linux"], fairness_key="k")
    clone.apply_async(["linux"], fairness_key="k", queue="other")  # explicit wins, as in Celery
    k = shard_of("k", SHARDS)
    assert where(app, *all_of("git"), *all_of("other")) == {
        shard_name("git", k): 1,
        shard_name("other", k): 1,
    }


def test_a_shard_is_declared_like_its_base_queue(app):
    base = Queue("git", Exchange("git-ex", "direct"), "git", queue_arguments={"x-max-priority": 5})
    app.conf.task_queues = [base]
    shards = Shards.of(app).queues(app.amqp.queues["git"])
    assert [s.name for s in shards] == [shard_name("git", i) for i in range(SHARDS)]
    for shard in shards:
        assert shard.exchange.name == "git-ex"
        assert shard.exchange.type == "direct"
        assert shard.queue_arguments == {"x-max-priority": 5}
        assert shard.queue_arguments is not base.queue_arguments
        assert shard.routing_key == f"git.fair.{shard_index(shard.name)}"
        assert app.amqp.queues[shard.name] is shard


def test_send_task_with_fair_headers_goes_to_its_shard_through_fair_router(app):
    app.conf.task_routes = [fair_router(app, {"git.*": {"queue": "git"}})]
    app.send_task("git.clone", ["linux"], headers=fair_headers("clone", "k", "linux"))
    app.send_task("git.repack", ["linux"], headers=fair_headers("repack", None, "linux"))
    app.send_task("other", headers=fair_headers("clone", "k"))
    app.send_task("other", headers=fair_headers("clone", "k"), queue="mine")
    k = shard_of("k", SHARDS)
    assert where(app, *all_of("git"), *all_of("q"), *all_of("mine")) == {
        shard_name("git", k): 1,
        "git": 1,  # no key: the base queue
        shard_name("q", k): 1,
        shard_name("mine", k): 1,
    }


def test_one_shard_is_no_sharding(app):
    app.conf.fair_shards = 1
    clone_task(app).apply_async(["linux"], fairness_key="k")
    assert where(app, *all_of("q")) == {"q": 1}


@pytest.mark.parametrize("bad", [0, -1, 2.5, "8", True])
def test_a_bad_shard_count_stops_the_worker(bad):
    with pytest.raises(ConfigurationError, match="fair_shards"):
        FairSettings.from_mapping({"fair_shards": bad})


def test_a_fair_worker_consumes_the_shards_of_every_queue_it_consumes(app):
    app.amqp.queues.select(["q", "git"])
    assert sorted(consume_shards(app)) == ["git", "q"]
    assert sorted(app.amqp.queues.consume_from) == sorted([*all_of("q"), *all_of("git")])


@pytest.mark.parametrize("routes", [None, {"other.*": {"queue": "elsewhere"}}])
def test_the_base_queue_is_the_one_celerys_router_gives_with_routes_or_without(app, routes):
    from celery.exceptions import QueueNotFound

    from celery_fair.routing import resolve_base

    app.conf.task_routes = routes
    app.conf.task_queues = [Queue("q"), Queue("hi", Exchange("hi", type="topic"), "hi.#")]
    clone_task(app)
    for option, expected in [
        (None, "q"),  # the default queue
        ("", "q"),
        ("hi", "hi"),
        (Queue("hi"), "hi"),
        (shard_name("hi", 3), "hi"),  # a retry comes with its shard
        ("q.fair.lane.2", "q"),
        ("new", "new"),  # created, as Celery creates a missing queue
    ]:
        options = {} if option is None else {"queue": option}
        base = resolve_base(app, "repos.clone", ["x"], {}, options)
        assert base.name == expected, option
        assert base is app.amqp.queues[expected]  # Celery's own Queue, with its bindings
        assert options == ({} if option is None else {"queue": option})  # left as it was
    # Celery's refusal of a queue it may not create is the same.
    app.conf.task_create_missing_queues = False
    app.amqp.queues.create_missing = False
    with pytest.raises(QueueNotFound):
        resolve_base(app, "repos.clone", ["x"], {}, {"queue": "nowhere"})
