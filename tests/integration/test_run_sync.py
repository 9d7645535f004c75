"""Foreground work (issue 22): ``task.run_sync`` goes through the same fair scheduler as the
background jobs, with real ``celery worker -P fair`` processes on both brokers."""

from __future__ import annotations

import time

import pytest
from harness import BACKEND, queue_length, wait_until
from test_fleet import fleet_conf

from celery_fair import ConfigurationError, RunTimeout

SLOTS = 2


def test_run_sync_right_after_a_burst_takes_the_next_free_slot(make_run, start_worker, broker):
    # Given a worker of 2 processes, and a client's burst of 300 jobs of 0.2 s just
    # published (most of it still in the broker),
    run = make_run(backend=BACKEND, conf=fleet_conf(broker))
    start_worker(run, concurrency=SLOTS)
    clone = run.app.tasks["fairapp.clone"]
    for i in range(300):
        clone.apply_async([f"bulk{i}", 0.2], fairness_key="bulk")
    # when a web request runs a job in the foreground right after,
    asked = time.time()
    answer = clone.run_sync(["web", 0.01], fairness_key="10.0.0.7", timeout=60)
    # then it returns the job's result,
    assert answer == "web"
    # and it started at the next free slot: at most one burst job per process (and one
    # admitted ahead of a free slot) started between the call and its start, not the burst.
    events = run.recorder.events()
    web = next(e["t"] for e in events if e["event"] == "start" and e["tag"] == "web")
    before = [
        e
        for e in events
        if e["event"] == "start" and e["tag"].startswith("bulk") and asked <= e["t"] < web
    ]
    assert len(before) <= 2 * SLOTS, len(before)
    assert run.recorder.done_counts().get("bulk299") is None  # the burst was still going


def test_run_sync_raises_the_tasks_exception(make_run, start_worker, broker):
    run = make_run(backend=BACKEND, conf=fleet_conf(broker))
    start_worker(run, concurrency=1)
    with pytest.raises(ValueError, match="boom: b1"):
        run.app.tasks["fairapp.boom"].run_sync(["b1"], fairness_key="a", timeout=30)


def test_run_sync_past_its_timeout_cancels_the_job_it_waited_for(make_run, start_worker, broker):
    # Given a worker of one process busy with a long clone of linux,
    run = make_run(backend=BACKEND, conf=fleet_conf(broker))
    start_worker(run, concurrency=1)
    clone = run.app.tasks["fairapp.clone"]
    clone.apply_async(["long", 4.0], fairness_key="a", job_id="linux")
    wait_until(lambda: run.recorder.events(), 20, "the long job to start")
    # when a foreground clone of linux (held by the conflict) waits 1 s,
    with pytest.raises(RunTimeout) as caught:
        clone.run_sync(["late", 0.01], fairness_key="b", job_id="linux", timeout=1.0)
    # then it raises RunTimeout, having cancelled the job before it ran,
    assert caught.value.cancel == "cancelled"
    assert run.app.AsyncResult(caught.value.task_id).state == "REVOKED"
    # which never runs, while the jobs after it do.
    wait_until(lambda: run.recorder.done_counts().get("long") == 1, 20, "the long job")
    clone.apply_async(["after", 0.01], fairness_key="c", job_id="linux")
    wait_until(lambda: run.recorder.done_counts().get("after") == 1, 20, "a later job")
    assert "late" not in run.recorder.done_counts()


def test_run_sync_without_a_result_backend_says_so_and_publishes_nothing(make_run, broker):
    run = make_run()
    with pytest.raises(ConfigurationError, match="needs a result backend"):
        run.app.tasks["fairapp.clone"].run_sync(["x"], fairness_key="a", timeout=1)
    assert queue_length(run, run.queue) == 0
