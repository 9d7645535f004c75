"""The prefetch window: Celery's own while no fair job is inside the worker, raised by the gate
while it holds fair jobs, and given back once none has been inside for a sweep interval."""

from __future__ import annotations

import socket

import pytest
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


def ready_in_broker(run) -> int:
    """The queue's messages no consumer holds."""
    with run.app.connection_for_write() as conn:
        channel = conn.default_channel
        if run.broker == "amqp":
            return channel.queue_declare(run.queue, passive=True).message_count
        return channel.client.llen(run.queue)


def test_a_worker_takes_in_no_more_plain_tasks_than_celerys_window(make_run, start_worker):
    """The broker's side of the window: on RabbitMQ each shard's consumer has a window of its
    own (consumer_prefetch.py), and setting one lifts the channel's for a moment, which bounds
    the queue's own consumer: neither a worker that starts on a backlog nor one that consumes a
    shard again takes more of it than Celery would."""
    # Given a backlog of a long plain task and twelve short ones (and no intake: on RabbitMQ it
    # takes messages off the queue for a moment to look at them),
    conf = {"worker_prefetch_multiplier": MULTIPLIER, "fair_intake_interval": None}
    run = make_run(conf={**conf, "fair_sweep_interval": 0.2})
    run.send("fairapp.plain", "long", 5.0)
    behind = 12
    for i in range(behind):
        run.send("fairapp.plain", f"p{i}", 0.01)
    # when a worker of one process starts on it,
    worker = start_worker(run, concurrency=CONCURRENCY)
    wait_until(lambda: run.recorder.events(), 20, "the long task to start")
    # then while the long one runs, it takes in what Celery's window lets it, and the rest
    # stays in the broker;
    wait_until(lambda: ready_in_broker(run) <= behind - (CELERYS - 1), 20, "the window to fill")
    assert prefetch_count(run, worker) == CELERYS  # (a round trip to the worker, and back)
    assert ready_in_broker(run) >= behind - CELERYS
    wait_until(lambda: len(run.recorder.done_counts()) == behind + 1, 30, "every task")


@pytest.mark.parametrize("broker", ["amqp"])
def test_a_wider_shard_window_on_rabbitmq_takes_no_more_of_the_backlog(make_run, start_worker):
    """Consuming a shard again with a wider window of its own lifts the channel's window for a
    moment (consumer_prefetch.py): the queue's own consumer must not take the backlog then."""
    conf = {"worker_prefetch_multiplier": MULTIPLIER, "fair_intake_interval": None}
    run = make_run(conf={**conf, "fair_sweep_interval": 0.2})
    # Given fair jobs due later (they reach the worker first, and wait in Celery's timer: the
    # worker then consumes their shard again with a wider window, as Celery widens its own by
    # one for each), then a backlog of a long plain task and twelve short ones,
    clone = run.app.tasks["fairapp.clone"]
    later = 3
    for i in range(later):
        clone.apply_async([f"later{i}", 0.01], fairness_key="A", countdown=15)
    run.send("fairapp.plain", "long", 20.0)
    behind = 12
    for i in range(behind):
        run.send("fairapp.plain", f"p{i}", 0.01)
    # when a worker of one process starts on them,
    worker = start_worker(run, concurrency=CONCURRENCY)
    wait_until(lambda: run.recorder.events(), 20, "the long task to start")
    wait_until(
        lambda: max(gate_stats(run, worker)["fair-shard-windows"].values()) > CONCURRENCY + 1,
        20,
        "the shard's window to widen",
    )
    # then while the long one runs, the worker holds what Celery's window lets in (widened by
    # one for each job due later, and by the place the gate keeps open while fair jobs are
    # inside: the long one and 4 short ones), and the rest of the backlog stays in the broker.
    ready, stats = ready_in_broker(run), gate_stats(run, worker)
    seen = {  # what the worker had done and held, to name the cause should this fail
        "started": [e.get("tag") for e in run.recorder.events()],
        "done": run.recorder.done_counts(),
        "ready": ready,
        **{k: v for k, v in stats.items() if k.startswith(("fair-window", "fair-held", "fair-s"))},
    }
    assert run.recorder.done_counts().get("long") is None, seen
    # (the jobs due later are still in Celery's timer: none has come to the gate to raise it)
    assert stats["fair-window-raised"] == 0, seen
    assert ready >= behind - CELERYS, seen
    wait_until(
        lambda: len(run.recorder.done_counts()) == behind + 1 + later,
        60,
        "every task",
        show=lambda: run.recorder.done_counts(),
    )
