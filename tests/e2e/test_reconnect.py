"""Broker connection loss: held copies are dropped, the broker redelivers, nothing runs twice."""

from __future__ import annotations

from harness import FAST_RESTORE, cut_broker_connections, gate_stats, wait_until

from celery_fair import fair_headers


def test_connection_loss_drops_held_copies_and_each_job_still_runs_once(
    make_run, start_worker, broker
):
    conf = {}
    if broker == "redis":  # restore the dead channel's unacked messages quickly
        conf = {"broker_transport_options": dict(FAST_RESTORE)}
    run = make_run(conf=conf)
    worker = start_worker(run, concurrency=2)
    # Given a running job and four held behind its conflict (long enough to be running still
    # when the test cuts the connections: at 3 s it had ended first under CI's load),
    run.send("fairapp.clone", "blocker", 10.0, headers=fair_headers("clone", "k", "linux"))
    wait_until(lambda: any(e["tag"] == "blocker" for e in run.recorder.events()), 20, "blocker")
    tags = [f"held{i}" for i in range(4)]
    for tag in tags:
        run.send("fairapp.clone", tag, 0.01, headers=fair_headers("clone", "k", "linux"))
    wait_until(lambda: gate_stats(run, worker).get("fair-held") == 4, 20, "four held jobs")
    # When the broker closes the worker's connections,
    assert cut_broker_connections(worker) >= 1
    # Then the worker reconnects, and every job runs exactly once.
    wait_until(lambda: len(run.recorder.done_counts()) == 5, 60, "all five jobs")
    assert run.recorder.done_counts() == dict.fromkeys(["blocker", *tags], 1)
    assert "Connection lost: forgetting 4 held message(s)" in worker.log()
