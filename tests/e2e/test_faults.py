"""Faults: a worker killed with SIGKILL, and holds longer than the broker waits for an ack."""

from __future__ import annotations

from harness import FAST_RESTORE, gate_stats, wait_until, wait_until_recorded_by_the_broker

from celery_fair import fair_headers

# Short ack timeouts so the tests run in seconds (Redis: see FAST_RESTORE). The Redis broker is
# also the shared store by default: a short lease lets a killed worker's jobs go in seconds.
FAST_REDIS = {
    "broker_transport_options": dict(FAST_RESTORE),
    "fair_lease_seconds": 3,
}


def running_late_jobs(make_run, start_worker, broker, count, seconds):
    """A worker with 2 slots running 2 of ``count`` acks_late jobs and holding the others."""
    run = make_run(conf=dict(FAST_REDIS) if broker == "redis" else {})
    tags = [f"late{i}" for i in range(count)]
    for tag in tags:
        run.send("fairapp.late", tag, seconds, headers=fair_headers("late", "k", tag))
    worker = start_worker(run, concurrency=2)
    wait_until(
        lambda: len([e for e in run.recorder.events() if e["event"] == "start"]) >= 2,
        20,
        "two jobs to be running",
    )
    wait_until_recorded_by_the_broker(run, count)  # none in flight when the worker goes
    return run, worker, tags


def test_sigkill_with_running_and_held_acks_late_jobs_loses_nothing_and_runs_each_once(
    make_run, start_worker, broker
):
    # Given a worker running 2 acks_late jobs and holding 8 more,
    run, worker, tags = running_late_jobs(make_run, start_worker, broker, 10, 2.0)
    # When it is killed with SIGKILL mid-job and another worker starts,
    worker.kill()
    ended_before_the_kill = {e["tag"] for e in run.recorder.events() if e["event"] == "end"}
    survivor = start_worker(run, concurrency=2)
    # Then every job completes: at least once (acks_late), and twice only if its first run
    # ended before the kill, its ack perhaps not yet in the broker (a slow machine can stretch
    # the 2 s jobs past the kill); every other job exactly once.
    wait_until(
        lambda: len(run.recorder.done_counts()) == 10,
        90,
        "all ten jobs to complete",
        show=lambda: (
            f"done: {run.recorder.done_counts()}\ngate: {gate_stats(run, survivor)}\n"
            f"log of the second worker:\n{survivor.log()[-4000:]}"
        ),
    )
    counts = run.recorder.done_counts()
    assert set(counts) == set(tags)
    assert {t for t, n in counts.items() if n > 1} <= ended_before_the_kill
    assert all(n <= 2 for n in counts.values())


def test_hold_longer_than_the_brokers_ack_timeout_runs_the_job_once(make_run, start_worker, broker):
    # Given a short ack timeout (Redis: visibility_timeout=4 s; RabbitMQ's consumer_timeout
    # cannot be shortened per queue before 3.11, so the same refresh is forced directly),
    conf = dict(FAST_REDIS) if broker == "redis" else {"fair_max_hold_seconds": 1.5}
    run = make_run(conf=conf)
    worker = start_worker(run, concurrency=2)
    # and a job held for 9 s behind a conflict,
    run.send("fairapp.clone", "blocker", 9.0, headers=fair_headers("clone", "k", "linux"))
    wait_until(lambda: any(e["tag"] == "blocker" for e in run.recorder.events()), 20, "blocker")
    run.send("fairapp.clone", "held", 0.01, headers=fair_headers("clone", "k", "linux"))
    # When the blocker ends,
    wait_until(lambda: run.recorder.done_counts().get("held"), 40, "the held job to run")
    # Then the held job ran exactly once, after the blocker, and the gate refreshed its hold.
    wait_until(lambda: gate_stats(run, worker).get("fair-refreshed", 0) >= 1, 5, "a refresh")
    events = run.recorder.events()
    assert [e["tag"] for e in events if e["event"] == "start"] == ["blocker", "held"]
    assert run.recorder.done_counts() == {"blocker": 1, "held": 1}


def test_a_pool_process_lost_mid_job_frees_its_slot_and_conflict(make_run, start_worker, broker):
    import os
    import signal

    run = make_run()
    start_worker(run, concurrency=2)
    run.send("fairapp.clone", "doomed", 30.0, headers=fair_headers("clone", "k", "linux"))
    start = wait_until(
        lambda: next((e for e in run.recorder.events() if e["tag"] == "doomed"), None),
        20,
        "the job to start",
    )
    run.send("fairapp.clone", "next", 0.01, headers=fair_headers("clone", "k", "linux"))
    os.kill(start["pid"], signal.SIGKILL)  # the pool process running it (WorkerLostError)
    wait_until(lambda: run.recorder.done_counts().get("next"), 30, "the next job on linux")
    assert "doomed" not in run.recorder.done_counts()


def test_warm_shutdown_finishes_running_jobs_and_held_ones_come_back(
    make_run, start_worker, broker
):
    run, worker, tags = running_late_jobs(make_run, start_worker, broker, 6, 1.5)
    worker.stop()  # SIGTERM: warm shutdown waits for the running jobs
    assert len(run.recorder.done_counts()) == 2
    start_worker(run, concurrency=2)
    wait_until(lambda: len(run.recorder.done_counts()) == 6, 60, "the held jobs to come back")
    assert run.recorder.done_counts() == dict.fromkeys(tags, 1)


def test_cold_shutdown_loses_nothing_acks_late_and_each_job_runs_once(
    make_run, start_worker, broker
):
    import os
    import signal

    run, worker, tags = running_late_jobs(make_run, start_worker, broker, 6, 2.0)
    os.kill(worker.pid, signal.SIGQUIT)  # cold shutdown: running jobs are not waited for
    worker.proc.wait(30)
    assert not run.recorder.done_counts()
    start_worker(run, concurrency=2)
    wait_until(lambda: len(run.recorder.done_counts()) == 6, 90, "every job after a restart")
    assert run.recorder.done_counts() == dict.fromkeys(tags, 1)
