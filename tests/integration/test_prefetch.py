"""The prefetch window: Celery's own while no fair job is inside the worker, raised by the gate
while it holds fair jobs, and given back once none has been inside for a sweep interval."""

from __future__ import annotations

import socket

from harness import gate_stats, wait_until

from celery_fair import fair_headers

CONCURRENCY = 1
MULTIPLIER = 4
CELERYS = CONCURRENCY * MULTIPLIER  # what plain Celery prefetches


def prefetch_count(run, worker) -> int:
    node = f"{worker.name}@{socket.gethostname()}"
    stats = run.app.control.inspect(destination=[node], timeout=1).stats() or {}
    return stats[node]["prefetch_count"]


def test_the_window_is_celerys_unless_fair_jobs_are_inside(make_run, start_worker):
    run = make_run(conf={"worker_prefetch_multiplier": MULTIPLIER, "fair_sweep_interval": 0.2})
    worker = start_worker(run, concurrency=CONCURRENCY)
    assert prefetch_count(run, worker) == CELERYS
    # Plain tasks leave it alone.
    for i in range(3):
        run.send("fairapp.plain", f"p{i}", 0.05)
    wait_until(lambda: len(run.recorder.done_counts()) == 3, 20, "the plain tasks")
    assert prefetch_count(run, worker) == CELERYS
    # Fair jobs waiting for a conflict are held: the gate raises the window past them.
    for i in range(4):
        run.send("fairapp.clone", f"f{i}", 0.5, headers=fair_headers("clone", "k", "linux"))
    wait_until(lambda: gate_stats(run, worker).get("fair-held", 0) >= 2, 20, "held jobs")
    assert prefetch_count(run, worker) > CELERYS + 2
    # Idle again: Celery's window.
    wait_until(lambda: len(run.recorder.done_counts()) == 7, 30, "the fair jobs")
    wait_until(lambda: prefetch_count(run, worker) == CELERYS, 10, "the window to close")
