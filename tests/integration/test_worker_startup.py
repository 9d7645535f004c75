"""How a fair worker is started: every documented way works, and bad settings stop it."""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis
from harness import HERE, gate_stats, wait_until

from celery_fair import fair_headers

CLASS_PATH = "celery_fair.worker.pool:FairPool"


@pytest.mark.parametrize("broker", ["redis"])
@pytest.mark.parametrize(
    ("pool", "conf", "env"),
    [
        ("fair", {}, {}),
        (CLASS_PATH, {}, {}),
        ("prefork", {"worker_pool": CLASS_PATH}, {}),
        ("custom", {}, {"CELERY_CUSTOM_WORKER_POOL": CLASS_PATH}),
    ],
    ids=["-P fair", "-P class-path", "worker_pool setting", "-P custom"],
)
def test_every_documented_way_to_choose_the_fair_pool_installs_the_gate(
    make_run, start_worker, pool, conf, env
):
    run = make_run(conf=conf)
    worker = start_worker(run, pool=pool, concurrency=2, env=env)
    assert "celery-fair gate ready" in worker.log()
    run.send("fairapp.clone", "one", 0.01, headers=fair_headers("clone", "k", "r"))
    wait_until(lambda: run.recorder.done_counts().get("one"), 20, "a job through the gate")
    assert gate_stats(run, worker)["fair-admitted"] == 1


@pytest.mark.parametrize("broker", ["redis"])
@pytest.mark.parametrize("inner", ["prefork", "threads", "solo"])
def test_fair_pool_wraps_the_pool_fair_pool_names(make_run, start_worker, inner):
    run = make_run(conf={"fair_pool": inner})
    worker = start_worker(run, concurrency=1 if inner == "solo" else 2)
    stats = gate_stats(run, worker)
    module = {"prefork": "prefork", "threads": "thread", "solo": "solo"}[inner]
    assert stats["implementation"] == f"celery.concurrency.{module}:Fair{'TaskPool'}"
    for i in range(4):
        run.send("fairapp.clone", f"j{i}", 0.01, headers=fair_headers("clone", f"k{i}", f"r{i}"))
    wait_until(lambda: len(run.recorder.done_counts()) == 4, 20, "four jobs")


@pytest.mark.parametrize("broker", ["redis"])
@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"fair_max_held": 0}, "fair_max_held: must be an int >= 1, got 0"),
        ({"fair_pool": "nonsense.module:Pool"}, "fair_pool: cannot load pool"),
        ({"fair_typo": 1}, "unknown celery-fair setting(s): fair_typo"),
        ({"fair_types": {"clone": {"priority": 2}}}, "job type 'clone' is declared twice"),
        (
            {"fair_store_url": "sentinel://127.0.0.1:26379/0"},
            "fair_store_url: a sentinel:// URL needs the master's name",
        ),
    ],
)
def test_a_bad_setting_stops_the_worker_with_a_message_naming_it(make_run, conf, message):
    run = make_run(conf=conf)
    proc = run_worker_to_exit(run)
    assert proc.returncode == 78
    assert f"celery-fair: invalid configuration: {message}" in proc.stderr


@pytest.mark.parametrize("broker", ["redis"])
def test_a_store_holding_another_schema_stops_the_worker(make_run):
    run = make_run()  # the broker's Redis is the store, under the run's prefix
    client = redis.Redis.from_url(run.url)
    client.hset(f"{{{run.prefix}}}:meta", "schema", "999")
    client.close()
    proc = run_worker_to_exit(run)
    assert proc.returncode == 78
    assert "celery-fair: invalid configuration: celery-fair: the store at" in proc.stderr
    assert "has schema 999" in proc.stderr


@pytest.mark.parametrize("broker", ["redis", "amqp"])
@pytest.mark.parametrize(
    ("store", "mode"), [(None, None), ("memory", None), ("redis://127.0.0.1:6379/3", "shared")]
)
def test_where_a_worker_keeps_its_state(make_run, start_worker, broker, store, mode):
    # None: the broker's Redis on a Redis broker, this worker alone on RabbitMQ.
    run = make_run(conf={} if store is None else {"fair_store_url": store})
    worker = start_worker(run, concurrency=1)
    expected = mode or ("shared" if broker == "redis" and store is None else "alone")
    assert gate_stats(run, worker)["fair-store-mode"] == expected


def run_worker_to_exit(run):
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "fairapp",
            "worker",
            "-P",
            "fair",
            "-Q",
            run.queue,
            "--without-mingle",
            "--without-gossip",
        ],
        cwd=HERE,
        env=run.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
