"""Everything Celery users rely on keeps working through ``-P fair``, prefork and threads.

One worker per (broker, pool) serves every test of this module; each test uses its own tags.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from celery import chain, chord, group
from harness import BACKEND, Run, Worker, gate_stats, intervals, wait_until

from celery_fair import fair_headers


@pytest.fixture(scope="module", params=["redis", "amqp"])
def module_broker(request):
    return request.param


@pytest.fixture(scope="module", params=["prefork", "threads"])
def world(request, module_broker, tmp_path_factory):
    run = Run(module_broker, backend=BACKEND, conf={"fair_pool": request.param})
    worker = Worker(run, concurrency=3, log_dir=tmp_path_factory.mktemp("logs"))
    worker.start()
    yield run, worker, request.param
    worker.stop()
    run.cleanup()


def task(run, name):
    return run.app.tasks[name]


def done(run, tag):
    return run.recorder.done_counts().get(tag, 0)


def test_chain_group_and_chord_return_their_results(world):
    run, _, _ = world
    add, tsum = task(run, "fairapp.add"), task(run, "fairapp.tsum")
    assert chain(add.s(1, 2), add.s(3)).apply_async().get(timeout=30) == 6
    assert group(add.s(i, i) for i in range(5)).apply_async().get(timeout=30) == [0, 2, 4, 6, 8]
    assert chord(add.s(i, 10) for i in range(4))(tsum.s()).get(timeout=30) == 46


def test_retry_with_countdown_runs_again_with_the_same_fairness_key(world):
    run, _, _ = world
    tag = f"flaky-{time.time_ns()}"
    task(run, "fairapp.flaky").apply_async([tag], fairness_key="retry-key")
    wait_until(lambda: done(run, tag), 30, "the retried task to succeed")
    attempts = [e for e in run.recorder.events() if e["tag"] == tag]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert {a["key"] for a in attempts} == {"retry-key"}
    assert attempts[1]["t"] - attempts[0]["t"] >= 0.9  # countdown=1


def test_eta_is_honoured(world):
    run, _, _ = world
    tag = f"eta-{time.time_ns()}"
    eta = datetime.now(timezone.utc) + timedelta(seconds=1.5)
    task(run, "fairapp.clone").apply_async([tag], eta=eta, fairness_key="k", job_id=tag)
    wait_until(lambda: done(run, tag), 30, "the ETA task")
    start = next(e["t"] for e in run.recorder.events() if e["tag"] == tag)
    assert start >= eta.timestamp() - 0.05


def test_rate_limit_spreads_starts(world):
    run, _, _ = world
    tags = [f"rl-{time.time_ns()}-{i}" for i in range(4)]
    for tag in tags:
        task(run, "fairapp.limited").apply_async([tag], fairness_key="k")
    wait_until(lambda: all(done(run, t) for t in tags), 30, "the rate-limited tasks")
    starts = sorted(e["t"] for e in run.recorder.events() if e["tag"] in tags)
    assert starts[-1] - starts[0] >= 1.2  # 2/s: four starts span at least 1.5 s


# Celery's thread pool has no time limits and cannot terminate a running task, with or without
# -P fair, so these two run on prefork only.
@pytest.mark.parametrize("world", ["prefork"], indirect=True)
def test_soft_time_limit_is_raised_in_the_task(world):
    run, _, _ = world
    tag = f"soft-{time.time_ns()}"
    task(run, "fairapp.slow_soft").apply_async([tag], fairness_key="k")
    wait_until(lambda: done(run, f"{tag}:soft-limit"), 30, "the soft time limit")


def test_plain_task_runs_next_to_fair_ones(world):
    run, _, _ = world
    tag = f"plain-{time.time_ns()}"
    run.send("fairapp.plain", tag, 0.01)
    wait_until(lambda: done(run, tag), 30, "the plain task")


def test_revoking_a_held_task_removes_it_from_the_gate(world):
    run, worker, _ = world
    blocker, held = f"blocker-{time.time_ns()}", f"held-{time.time_ns()}"
    repo = f"repo-{time.time_ns()}"
    run.send("fairapp.clone", blocker, 3.0, headers=fair_headers("clone", "k", repo))
    wait_until(lambda: any(e["tag"] == blocker for e in run.recorder.events()), 20, "blocker")
    result = run.send("fairapp.clone", held, 0.01, headers=fair_headers("clone", "k", repo))
    wait_until(lambda: gate_stats(run, worker).get("fair-held", 0) >= 1, 10, "the hold")
    before = gate_stats(run, worker)["fair-revoked-held"]
    result.revoke()
    wait_until(
        lambda: gate_stats(run, worker)["fair-revoked-held"] > before,
        5,
        "the gate to drop the revoked task (well before the blocker ends)",
    )
    wait_until(lambda: done(run, blocker), 20, "the blocker")
    assert not any(e["tag"] == held for e in run.recorder.events())


@pytest.mark.parametrize("world", ["prefork"], indirect=True)
def test_revoke_with_terminate_stops_a_running_task_and_frees_its_slot(world):
    run, _, _ = world
    tag, after = f"long-{time.time_ns()}", f"after-{time.time_ns()}"
    repo = f"repo-{time.time_ns()}"
    result = run.send("fairapp.clone", tag, 30.0, headers=fair_headers("clone", "k", repo))
    wait_until(lambda: any(e["tag"] == tag for e in run.recorder.events()), 20, "it to start")
    result.revoke(terminate=True)
    # The conflict on the same repo is released: a job on it runs.
    run.send("fairapp.clone", after, 0.01, headers=fair_headers("clone", "k", repo))
    wait_until(lambda: done(run, after), 20, "the next job on the same repo")
    assert not done(run, tag)
    assert tag not in intervals(run.recorder.events())


def test_hard_time_limit_kills_the_task_and_frees_its_slot_and_conflict(make_run, start_worker):
    run = make_run()
    start_worker(run, concurrency=2)
    run.send("fairapp.slow_hard", "hard", headers=fair_headers("clone", "k", "linux"))
    started = wait_until(
        lambda: next((e for e in run.recorder.events() if e["tag"] == "hard"), None),
        20,
        "the slow job to start",
    )
    run.send("fairapp.clone", "next", 0.01, headers=fair_headers("clone", "k", "linux"))
    wait_until(lambda: run.recorder.done_counts().get("next"), 20, "the next job on linux")
    nxt = next(e for e in run.recorder.events() if e["tag"] == "next" and e["event"] == "start")
    assert nxt["t"] - started["t"] < 4  # after the 1 s limit, long before the 5 s sleep ends
    assert "hard" not in run.recorder.done_counts()
