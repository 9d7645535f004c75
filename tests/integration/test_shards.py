"""Fair shard queues with real workers: a newcomer waits behind no one's burst, from the
publish on, and every way a fair job is published lands in its key's shard."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from celery import chain, group
from harness import gate_stats, intervals, node, wait_until
from test_lanes import store_of

from celery_fair import cli, fair_headers, fair_router
from celery_fair.core.lanes import DEFAULT_LANES, DEFAULT_THRESHOLD
from celery_fair.protocol import lane_name
from celery_fair.routing import shard_name, shard_of


def lane_of(base: str):
    return lambda j: lane_name(base, j)


SLOTS = 2
SHARDS = 8


def narrow_windows(run) -> dict[str, int]:
    """Each shard's own window on RabbitMQ while nothing blocks: what a worker can start + 1."""
    return {shard_name(run.queue, i): SLOTS + 1 for i in range(SHARDS)}


def starts(run, tag):
    return [e for e in run.recorder.events() if e["event"] == "start" and e["tag"] == tag]


def test_a_newcomer_published_right_after_a_burst_waits_behind_no_more_than_the_slots(
    make_run, start_worker
):
    # Given a worker, and client A's burst of 3,000 jobs still being published and taken in,
    run = make_run()
    worker = start_worker(run, concurrency=SLOTS)
    clone = run.app.tasks["fairapp.clone"]
    burst = 3000
    for i in range(burst):
        # 100 ms each: counting A's starts before B then measures order, not how fast B's
        # message crosses a noisy machine (20 ms jobs left B about 40 ms)
        clone.apply_async([f"A{i}", 0.1], fairness_key="A")
    # when client B publishes two jobs right after it (the burst is mostly in the broker),
    published = time.time()
    for i in range(2):
        clone.apply_async([f"B{i}", 0.02], fairness_key="B")
    # then B's jobs start behind no more of A's than those already running or about to.
    wait_until(lambda: all(run.recorder.done_counts().get(f"B{i}") for i in range(2)), 30, "B")
    spans = intervals(run.recorder.events())
    b_started = max(spans[f"B{i}"][0] for i in range(2))
    a_between = [
        t for t, (s, _) in spans.items() if t.startswith("A") and published < s < b_started
    ]
    a_before = [t for t, (s, _) in spans.items() if t.startswith("A") and s <= published]
    assert len(a_between) <= 2 * SLOTS, (len(a_between), len(a_before), b_started - published)
    if run.broker == "amqp":  # (each shard's consumer has a window of what it can start + 1)
        assert gate_stats(run, worker)["fair-shard-windows"] == narrow_windows(run)


def test_workers_share_a_burst_in_the_broker_and_none_takes_in_more_than_it_can_start(
    make_run, start_worker
):
    """On Redis a gate holds what it can start plus a look at each shard; on RabbitMQ up to
    ``fair_max_held`` (Gate._window_limit says why), and the workers still share the burst."""
    # Given two workers of two processes each,
    run = make_run()
    workers = [start_worker(run, concurrency=SLOTS) for _ in range(2)]
    clone = run.app.tasks["fairapp.clone"]
    # when client A publishes a burst of 1,000 short jobs,
    burst = 1000
    for i in range(burst):
        clone.apply_async([f"A{i}", 0.01], fairness_key="A")
    wait_until(lambda: len(run.recorder.done_counts()) == burst, 120, "the burst")
    # then on Redis neither gate ever held more than it can start plus a look at each shard
    # and at A's lane (A turned heavy: docs/operations.md#lanes-heavy-keys-out-of-the-way)
    # (and the window's place ahead, and Celery's own window: one per process), the rest of
    # the burst waiting in the broker for whichever worker is free,
    ran = {w.pid: 0 for w in workers}
    for event in run.recorder.events():
        if event["event"] == "start":
            ran[event["ppid"]] += 1
    for worker in workers:
        stats = gate_stats(run, worker)
        bound = stats["fair-slots"] + stats["fair-lookahead"] + SHARDS + 1 + SLOTS
        assert stats["fair-held-limit"] == (bound - 1 - SLOTS if run.broker == "redis" else 1000)
        if run.broker == "redis":
            lane = 1  # A's (the store is the broker's Redis)
            # and the worker reads past A's messages that waited in its shard from before its
            # lane: at most DEFAULT_THRESHOLD (shard_turns.slot_of)
            stragglers = DEFAULT_THRESHOLD
            peak = stats["fair-held-peak"]
            assert peak <= bound + lane + stragglers, (peak, bound, ran)
    # and each worker ran a good part of it.
    assert min(ran.values()) >= burst // 4, ran


def test_jobs_that_wait_for_a_conflict_do_not_hide_one_that_can_run_behind_them_in_the_shard(
    make_run, start_worker
):
    """The gate takes in only what it can start plus a look (on RabbitMQ, per shard); when
    all it holds waits for a conflict and a process idles, it looks deeper."""
    # Given a worker, and client A's twelve jobs on repository r, which run one at a time,
    run = make_run(conf={"fair_sweep_interval": 0.2})
    worker = start_worker(run, concurrency=SLOTS)
    clone = run.app.tasks["fairapp.clone"]
    for i in range(12):
        clone.apply_async([f"r{i}", 1.0], fairness_key="A", job_id="r")
    # when A then publishes a job on repository s, behind them in A's shard,
    clone.apply_async(["s", 0.01], fairness_key="A", job_id="s")
    # then it runs on the idle process long before the jobs on r ahead of it,
    wait_until(lambda: run.recorder.done_counts().get("s"), 30, "the job on s")
    started = [e["tag"] for e in run.recorder.events() if e["event"] == "start"]
    assert started.index("s") <= 3, started
    if run.broker == "amqp":
        # and once nothing waits for a conflict, each shard's window closes again, every job
        # run once (consuming a shard again loses and repeats nothing).
        wait_until(lambda: len(run.recorder.done_counts()) == 13, 60, "every job")
        assert set(run.recorder.done_counts().values()) == {1}, run.recorder.done_counts()
        wait_until(
            lambda: gate_stats(run, worker)["fair-shard-windows"] == narrow_windows(run),
            20,
            "the windows to close",
            show=lambda: gate_stats(run, worker)["fair-shard-windows"],
        )


def test_countdown_jobs_waiting_in_a_worker_do_not_stall_their_shard(make_run, start_worker):
    # Given a worker, and client A's six jobs due in 4 s (Celery holds each unacked, and in
    # its shard's window on RabbitMQ, until it is due),
    run = make_run(conf={"fair_sweep_interval": 0.2})
    start_worker(run, concurrency=SLOTS)
    clone = run.app.tasks["fairapp.clone"]
    for i in range(6):
        clone.apply_async([f"later{i}", 0.01], fairness_key="A", countdown=4)
    # when A then publishes a job to run now, behind them in A's shard,
    clone.apply_async(["now", 0.01], fairness_key="A")
    # then it runs before any of them is due.
    wait_until(lambda: len(run.recorder.done_counts()) == 7, 30, "every job")
    started = [e["tag"] for e in run.recorder.events() if e["event"] == "start"]
    assert started[0] == "now", started


def test_a_retry_an_eta_task_and_canvas_children_stay_in_their_keys_shard(make_run, start_worker):
    run = make_run()
    start_worker(run, concurrency=SLOTS)
    located = run.app.tasks["fairapp.located"]
    shard = shard_name(run.queue, shard_of("k", SHARDS))
    located.apply_async(["retried", 2], fairness_key="k")
    located.apply_async(["eta"], fairness_key="k", countdown=0.5)
    chain(located.s("chain-1").set(fairness_key="k"), located.si("chain-2")).apply_async()
    group(located.si(f"group-{i}").set(fairness_key="k") for i in range(3)).apply_async()
    tags = ["retried", "eta", "chain-1", "chain-2", *(f"group-{i}" for i in range(3))]
    wait_until(lambda: all(run.recorder.done_counts().get(t) for t in tags), 30, "every job")
    seen = {(e["tag"], e["retry"]): (e["queue"], e["key"]) for t in tags for e in starts(run, t)}
    assert len(seen) == len(tags) + 2  # the retried job ran three times
    assert set(seen.values()) == {(shard, "k")}, seen


def test_send_task_through_fair_router_lands_in_the_keys_shard(make_run, start_worker):
    run = make_run()
    start_worker(run, concurrency=SLOTS)
    run.app.conf.update(task_routes=[fair_router(run.app)])
    run.send("fairapp.located", "routed", headers=fair_headers("clone", "k"))
    run.send("fairapp.located", "unkeyed", headers=fair_headers("clone"))
    wait_until(lambda: len(run.recorder.done_counts()) == 2, 30, "both jobs")
    assert starts(run, "routed")[0]["queue"] == shard_name(run.queue, shard_of("k", SHARDS))
    assert starts(run, "unkeyed")[0]["queue"] == run.queue


def test_a_worker_consumes_the_shards_of_each_queue_it_is_given_and_of_queues_added_later(
    make_run, start_worker
):
    run = make_run()
    other, added = f"{run.queue}-2", f"{run.queue}-3"
    worker = start_worker(run, concurrency=SLOTS, queues=(run.queue, other))
    run.extra_queues += [other, added]

    def active_queues() -> set[str]:
        reply = run.app.control.inspect(destination=[node(worker)], timeout=1).active_queues()
        return {q["name"] for q in (reply or {}).get(node(worker), [])}

    # (with a shared store, on Redis the broker's, its lanes too: docs/operations.md#lanes)
    lanes = DEFAULT_LANES if run.broker == "redis" else 0

    def with_shards(base: str) -> set[str]:
        parts = [*(shard_name(base, i) for i in range(SHARDS)), *map(lane_of(base), range(lanes))]
        return {base, *parts}

    assert active_queues() == with_shards(run.queue) | with_shards(other)
    # The worker adds (and cancels) a consumer on its loop, after its reply: poll.
    run.app.control.add_consumer(added, destination=[node(worker)], reply=True)
    wait_until(lambda: active_queues() >= with_shards(added), 10, "the added queue's shards")
    located = run.app.tasks["fairapp.located"]
    for queue in (other, added):
        located.apply_async([queue], fairness_key="k", queue=queue)
    wait_until(lambda: len(run.recorder.done_counts()) == 2, 30, "a job on each queue")
    assert {starts(run, q)[0]["queue"] for q in (other, added)} == {
        shard_name(q, shard_of("k", SHARDS)) for q in (other, added)
    }
    run.app.control.cancel_consumer(added, destination=[node(worker)], reply=True)
    wait_until(lambda: not active_queues() & with_shards(added), 10, "its shards cancelled")


def test_jobs_returned_to_the_broker_go_to_the_back_of_their_keys_shard(make_run, start_worker):
    # Given jobs held behind a long one on the same repository, longer than fair_max_hold_seconds
    # (so the gate returns them to the broker), published to their shard and to the queue,
    run = make_run(conf={"fair_max_hold_seconds": 0.5, "fair_sweep_interval": 0.2})
    worker = start_worker(run, concurrency=SLOTS)
    located = run.app.tasks["fairapp.located"]
    located.apply_async(["long", 0, 2.0], fairness_key="k", job_id="linux")
    wait_until(lambda: starts(run, "long"), 20, "the long job")
    for i in range(3):
        located.apply_async([f"sharded-{i}"], fairness_key="k", job_id="linux")
        run.send("fairapp.located", f"queued-{i}", headers=fair_headers("clone", "k", "linux"))
    # then each goes back to its key's shard (where the intake puts what is published to the
    # queue, so where the jobs behind it wait), or to its key's lane once it has one (six of
    # k's jobs held, blocked, fill the shard's window: the worker asks for k's lane, so that
    # what waits behind them in the shard is not held up, core/lanes.py), and runs once.
    wait_until(lambda: len(run.recorder.done_counts()) == 7, 30, "every job")
    assert gate_stats(run, worker)["fair-refreshed"] >= 6
    queues = {shard_name(run.queue, shard_of("k", SHARDS))}
    if run.broker == "redis":  # lanes need a shared store: on Redis, the broker's
        store = store_of(run)
        lane = store.lanes(-1).lane_of("k")
        store.close()
        if lane is not None:
            queues.add(lane_name(run.queue, lane))
    assert {e["queue"] for e in run.recorder.events() if e["event"] == "start"} <= queues
    assert set(run.recorder.done_counts().values()) == {1}


def test_a_fair_worker_warns_about_a_worker_that_consumes_its_queue_without_the_shards(
    make_run, start_worker
):
    run = make_run()
    plain = start_worker(run, concurrency=1, pool="prefork")
    fair = start_worker(run, concurrency=1)
    warning = f"{node(plain)} consume(s) queue {run.queue!r} but not its shards"
    wait_until(lambda: warning in fair.log(), 20, "the warning in the fair worker's log")
    (line,) = [x for x in fair.log().splitlines() if "but not its shards" in x]
    assert node(fair) not in line  # the fair worker consumes the shards


def test_jobs_wait_in_shards_nobody_consumes_until_a_fair_worker_comes_and_the_cli_shows_them(
    make_run, start_worker, capsys
):
    # Given fair jobs published while no fair worker consumes the queue,
    run = make_run()
    clone = run.app.tasks["fairapp.clone"]
    for i in range(6):
        clone.apply_async([f"a{i}"], fairness_key="A")
    for i in range(2):
        clone.apply_async([f"b{i}"], fairness_key="B")
    run.send("fairapp.clone", "unkeyed", headers=fair_headers("clone"))
    # then `celery-fair shards` shows where they wait (and, on Redis, whose they are),
    argv = ["shards", run.url, run.queue, "--format", "json"]
    if run.broker == "redis":
        argv += ["--key-prefix", f"{run.prefix}:"]
    assert cli.main(argv) == 0
    (queue,) = json.loads(capsys.readouterr().out)
    waiting = {item["name"]: item["waiting"] for item in queue["lists"]}
    a, b = (shard_name(run.queue, shard_of(k, SHARDS)) for k in ("A", "B"))
    assert a != b  # (this test's keys: two shards)
    assert waiting == {name: {run.queue: 1, a: 6, b: 2}.get(name, 0) for name in waiting}
    if run.broker == "redis":
        keys = {item["name"]: item["keys"] for item in queue["lists"]}
        assert keys[a] == {"A": 6}
        assert keys[b] == {"B": 2}
        assert keys[run.queue] == {"(no key)": 1}
    # and a fair worker that comes later runs them all.
    start_worker(run, concurrency=SLOTS)
    wait_until(lambda: len(run.recorder.done_counts()) == 9, 30, "every job")


@pytest.mark.parametrize("broker", ["amqp"])
def test_shards_of_a_quorum_queue_are_quorum_queues_and_a_newcomer_waits_behind_few(
    make_run, start_worker
):
    # Given a RabbitMQ quorum queue (RabbitMQ 3.8+), whose consumers prefetch a fixed window,
    run = make_run(conf={"task_default_queue_type": "quorum"})
    start_worker(run, concurrency=SLOTS)
    clone = run.app.tasks["fairapp.clone"]
    for i in range(300):
        clone.apply_async([f"A{i}", 0.02], fairness_key="A")
    published = time.time()
    for i in range(2):
        clone.apply_async([f"B{i}", 0.02], fairness_key="B")
    # then each shard was declared as a quorum queue too, and B waited behind few of A's.
    wait_until(lambda: all(run.recorder.done_counts().get(f"B{i}") for i in range(2)), 30, "B")
    listed = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "name", "type"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    types = dict(line.split("\t") for line in listed.splitlines() if line.startswith(run.queue))
    assert types == dict.fromkeys([run.queue, *shards_of(run.queue)], "quorum")
    spans = intervals(run.recorder.events())
    b_started = max(spans[f"B{i}"][0] for i in range(2))
    a_between = [
        s for t, (s, _) in spans.items() if t.startswith("A") and published < s < b_started
    ]
    assert len(a_between) <= 2 * SLOTS, (len(a_between), b_started - published)


def shards_of(queue: str) -> list[str]:
    return [shard_name(queue, i) for i in range(SHARDS)]
