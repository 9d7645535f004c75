"""A worker paused past its lease (SIGSTOP: a long GC, a VM pause) and then resumed.

While it is stopped its lease expires, another worker reclaims what the store counted under
it and is admitted a job that conflicts with one the paused worker had reserved (admitted,
waiting for a free pool process). On resuming, the paused worker must not start that reserved
job: its admission may be gone. It gives it back and asks again, so the two never overlap, and
the job still runs once the conflict frees.
"""

from __future__ import annotations

import os
import signal

from harness import gate_stats, intervals, wait_until

from celery_fair import fair_headers

LEASE = 2.0
STORE = "redis://127.0.0.1:6379/3"  # with RabbitMQ as the broker, the store is a Redis of its own


def starts(run, tag):
    return [e for e in run.recorder.events() if e["event"] == "start" and e["tag"] == tag]


def test_a_reserved_job_of_a_worker_paused_past_its_lease_is_given_back_not_started(
    make_run, start_worker, broker
):
    conf = {"fair_lease_seconds": LEASE, "fair_store_poll_interval": 0.2}
    if broker == "amqp":
        conf["fair_store_url"] = STORE
    run = make_run(conf=conf)
    other_queue = f"{run.queue}-b"
    run.extra_queues.append(other_queue)
    # Given two workers of one slot each (the default lookahead: one reserved job), each on
    # a queue of its own, sharing one store,
    paused = start_worker(run, concurrency=1)
    start_worker(run, concurrency=1, queues=(other_queue,))
    # and the first running a job while a clone of repository "linux" waits in its reserve,
    run.send("fairapp.repack", "first", 1.5, headers=fair_headers("repack", "k", "other"))
    wait_until(lambda: starts(run, "first"), 20, "the first job to start")
    run.send("fairapp.clone", "reserved", 2.0, headers=fair_headers("clone", "k", "linux"))
    wait_until(
        lambda: gate_stats(run, paused).get("fair-reserved") == 1,
        20,
        "the clone to be reserved",
        show=lambda: gate_stats(run, paused),
    )
    # when that worker is stopped past its lease (its pool process finishes the first job
    # meanwhile) and the other worker is admitted a clone of the same repository,
    os.kill(paused.pid, signal.SIGSTOP)
    try:
        run.app.send_task(
            "fairapp.clone",
            ["rival", 3.0],
            headers=fair_headers("clone", "k", "linux"),
            queue=other_queue,
        )
        wait_until(lambda: starts(run, "rival"), 30, "the other worker's clone to start")
    finally:
        os.kill(paused.pid, signal.SIGCONT)
    # then the resumed worker does not start its reserved clone while the rival runs: the two
    # never overlap, and the reserved clone still runs, once, after the rival.
    wait_until(
        lambda: {"reserved", "rival"} <= run.recorder.done_counts().keys(),
        30,
        "both clones to run",
        show=lambda: f"{run.recorder.events()}\n{paused.log()[-3000:]}",
    )
    spans = intervals(run.recorder.events(), "clone")
    (reserved_start, _), (_, rival_end) = spans["reserved"], spans["rival"]
    assert reserved_start >= rival_end, spans
    assert run.recorder.done_counts() == {"first": 1, "reserved": 1, "rival": 1}
    assert gate_stats(run, paused).get("fair-store-given_back", 0) >= 1
