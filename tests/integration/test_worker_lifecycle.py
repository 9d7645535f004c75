"""Worker options that change the pool under the gate, and the events Flower reads."""

from __future__ import annotations

import threading

import pytest
from harness import intervals, max_overlap, wait_until

from celery_fair import fair_headers


@pytest.mark.parametrize("broker", ["redis"])
def test_capacity_follows_autoscale(make_run, start_worker):
    # Given a fair worker that may grow from 1 to 3 processes and a backlog of 1 s jobs,
    run = make_run()
    start_worker(run, concurrency=1, args=("--autoscale=3,1",))
    for i in range(9):
        run.send("fairapp.clone", f"j{i}", 1.0, headers=fair_headers("clone", f"k{i}", f"r{i}"))
    # When it grows, the gate admits as many as it has processes, and never more.
    wait_until(lambda: len(run.recorder.done_counts()) == 9, 60, "all nine jobs")
    overlap = max_overlap(list(intervals(run.recorder.events()).values()))
    assert overlap == 3


@pytest.mark.parametrize("broker", ["redis"])
def test_max_tasks_per_child_replaces_processes_and_jobs_keep_flowing(make_run, start_worker):
    # Each new process must come up while the intake asks the fleet for its queues on a
    # thread of the worker: asked over a pooled connection, a process started meanwhile hung
    # in Kombu's after-fork close of that connection and was killed after
    # worker_proc_alive_timeout (the default here, 4 s), with the pool short of a process.
    run = make_run()
    worker = start_worker(run, concurrency=2, args=("--max-tasks-per-child=1",))
    for i in range(6):
        run.send("fairapp.clone", f"j{i}", 0.05, headers=fair_headers("clone", "k", f"r{i}"))
    done = run.recorder.done_counts
    wait_until(
        lambda: len(done()) == 6, 60, "six jobs", show=lambda: (done(), worker.log()[-5000:])
    )
    pids = {e["pid"] for e in run.recorder.events() if e["event"] == "start"}
    assert len(pids) == 6  # a new process for every job


def test_task_events_flow_for_fair_tasks(make_run, start_worker):
    # Given a fair worker sending events (-E) and a listener that has heard it,
    run = make_run(conf={"fair_tier_caps": {9: 9}})  # a tier of its own for the job below
    start_worker(run, concurrency=1, args=("-E",))
    seen: list[dict] = []
    listening = threading.Event()

    def on_event(event: dict) -> None:
        seen.append(event)
        if event["type"].startswith("worker-"):
            listening.set()  # the subscription is live: later events will reach us
        if event["type"] == "task-succeeded":
            receiver.should_stop = True

    def listen() -> None:
        receiver.capture(limit=None, timeout=30, wakeup=True)

    with run.app.connection_for_read() as conn:
        receiver = run.app.events.Receiver(conn, handlers={"*": on_event})
        thread = threading.Thread(target=listen, daemon=True)
        thread.start()
        wait_until(listening.is_set, 20, "a worker event")
        # When a fair task of a type that ages runs at once (not urgent),
        headers = fair_headers("rescan", "k", "r", priority=9)  # a priority of its own
        result = run.send("fairapp.rescan", "evented", 0.01, headers=headers)
        thread.join(40)
    # Then Flower sees the same task events as for a plain worker, and the job's own priority;
    mine = [e for e in seen if e.get("uuid") == result.id]
    assert [e["type"] for e in mine] == ["task-received", "task-started", "task-succeeded"]
    assert mine[1]["fair_priority"] == 9
    # `urgent` only on a job that is (Flower shows a field that is set: not "Urgent: False"
    # on every task), though its effective priority is there, as aging is on for its type.
    assert "effective_priority" in mine[1]
    assert "urgent" not in mine[1]
