"""Beyond fair_max_held: held work that blocks the queue is returned to the broker, comes back
from it and runs, with real workers on each broker.

Which messages the gate returns and when (the lowest-ranked tenth, once per interval, never
while every slot is busy, a bad fair_republished count taken as none, paused jobs last) is
tests/unit/test_gate_spill.py's.
"""

from __future__ import annotations

import time

from harness import gate_stats, intervals, wait_until

from celery_fair import fair_headers


def test_held_work_that_blocks_a_free_slot_is_spilled_so_a_job_behind_it_runs(
    make_run, start_worker, broker
):
    # Given a worker that may hold 4 messages, with one long job on linux running
    # (spills are checked by the sweep: every 0.3 s here, as spills may come)
    run = make_run(
        conf={"fair_max_held": 4, "fair_spill_interval": 0.3, "fair_sweep_interval": 0.3}
    )
    worker = start_worker(run, concurrency=2)
    clone = run.app.tasks["fairapp.clone"]

    def send(tag, seconds, job_id):
        # On Redis through the fair task, straight into the key's shard: there the worker
        # reads first the queues it holds too few of, and the queue itself (where the intake
        # takes a plain publish from) could hand it the free job before any spill. On
        # RabbitMQ to the queue itself, as before: published into the shard, the free job 12
        # deep took 7 s in a trial (the shard's own window lets in one more message per
        # spill, and spills come at most once per sweep), a limit noted on issue 21.
        if broker == "redis":
            clone.apply_async([tag, seconds], fairness_key="k", job_id=job_id)
        else:
            run.send("fairapp.clone", tag, seconds, headers=fair_headers("clone", "k", job_id))

    send("L0", 8.0, "linux")
    wait_until(lambda: any(e["tag"] == "L0" for e in run.recorder.events()), 20, "L0 to start")
    # and twelve more on linux queued behind it (the window, Celery's prefetch plus what the
    # gate may hold, takes some; the rest wait in the broker), then a job on another repository
    # behind them all,
    for i in range(1, 13):
        send(f"L{i}", 0.05, "linux")
    published = time.time()
    send("free", 0.05, "other")
    # when the second slot stays free because every held job waits for linux,
    # then the gate returns held messages to the broker until it sees the free job, which runs
    # while L0 still runs, and afterwards every job runs exactly once.
    wait_until(lambda: run.recorder.done_counts().get("free"), 20, "the free job")
    spans = intervals(run.recorder.events())
    assert "L0" not in spans or spans["free"][0] < spans["L0"][1]
    assert spans["free"][0] - published < 6
    assert gate_stats(run, worker)["fair-spilled"] >= 1
    wait_until(lambda: len(run.recorder.done_counts()) == 14, 40, "every job")
    assert set(run.recorder.done_counts().values()) == {1}
