"""A worker's Prometheus metrics, scraped over HTTP from a real worker on both brokers (on
Redis with the shared store, on RabbitMQ alone)."""

from __future__ import annotations

import urllib.request

from harness import gate_stats, wait_until
from prometheus_client.parser import text_string_to_metric_families

from celery_fair import fair_headers
from celery_fair.core.allocation import KeyDemand, allocate


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample the worker serves, by (name, sorted labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(samples, name, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


CLONE = {"job_type": "clone", "tier": "8"}


def test_a_worker_serves_its_queue_waits_held_and_blocked_jobs_and_store_calls(
    make_run, start_worker
):
    # Given a worker that serves its metrics on a port the OS picks (shown by inspect stats),
    # and names no fairness key in them,
    run = make_run(conf={"fair_metrics_port": 0, "fair_metrics_top_keys": 0})
    worker = start_worker(run, concurrency=2)
    port = gate_stats(run, worker)["fair-metrics-port"]
    assert port > 0
    # when a long job holds repository linux, a second job on linux waits for it, held, and
    # three others run,
    secret = "tenant-4711-do-not-label"
    run.send("fairapp.clone", "holder", 3.0, headers=fair_headers("clone", secret, "linux"))
    wait_until(lambda: run.recorder.events(), 20, "the holder to start")
    run.send("fairapp.clone", "waiter", 0.01, headers=fair_headers("clone", secret, "linux"))
    for i in range(3):
        run.send("fairapp.clone", f"free{i}", 0.01, headers=fair_headers("clone", "k", f"r{i}"))
    # (the three free ones done first, so that the waiter is all the gate holds: CI once read
    # the stats while two of them were still held)
    done = run.recorder.done_counts
    wait_until(lambda: all(done().get(f"free{i}") for i in range(3)), 20, "the free jobs")

    def waiting():
        s = scrape(port)
        held = sample(s, "celery_fair_held_jobs", **CLONE)
        return s if held == 1 and sample(s, "celery_fair_blocked_jobs", reason="conflict") else None

    # then a scrape shows the held job, what blocks it and how long it has waited (its key
    # unnamed),
    during = wait_until(waiting, 20, "the waiter to be held", show=lambda: scrape(port))
    assert sample(during, "celery_fair_running_jobs", **CLONE) >= 1
    assert sample(during, "celery_fair_key_head_wait_seconds", key="other") >= 0
    # (inspect stats, and so Flower's worker page, counts the held and running ones by tier)
    stats = gate_stats(run, worker)
    assert stats["fair-held-tier-8"] == 1, stats
    assert stats["fair-running-tier-8"] >= 1, stats
    # and once all five have run, each one's wait and run time, and nothing held.
    wait_until(lambda: len(run.recorder.done_counts()) == 5, 30, "every job")

    def settled():
        s = scrape(port)
        return (
            s
            if sample(s, "celery_fair_job_duration_seconds_count", job_type="clone") == 5
            else None
        )

    after = wait_until(settled, 20, "the last end to be counted", show=lambda: scrape(port))
    assert sample(after, "celery_fair_queue_wait_seconds_count", **CLONE) == 5
    assert sample(after, "celery_fair_started_total", **CLONE) == 5
    # The waiter's wait (over a second behind the holder) is in the top buckets, not the first.
    assert sample(after, "celery_fair_queue_wait_seconds_bucket", le="0.5", **CLONE) <= 4
    assert sample(after, "celery_fair_queue_wait_seconds_sum", **CLONE) >= 1.0
    # (and the same wait at the head of the key's queue: no key named, all as other)
    hist = "celery_fair_key_head_wait_to_start_seconds"
    assert sample(after, f"{hist}_count", key="other") == 5
    assert sample(after, f"{hist}_bucket", le="0.5", key="other") <= 4
    assert sample(after, "celery_fair_held_jobs", **CLONE) in (None, 0)
    mode = "shared" if run.broker == "redis" else "alone"  # Redis: the broker's Redis is the store
    assert sample(after, "celery_fair_store_mode", mode=mode) == 1
    assert sum(v for (n, _), v in after.items() if n == "celery_fair_store_mode") == 1
    before = gate_stats(run, worker)["fair-store-calls"]
    calls = sum(
        v
        for (n, _), v in scrape(port).items()
        if n == "celery_fair_store_call_duration_seconds_count"
    )
    if run.broker == "redis":  # admissions went through the store: timed, and counted alike
        assert before <= calls <= gate_stats(run, worker)["fair-store-calls"]
        assert sample(after, "celery_fair_store_call_duration_seconds_count", kind="admit") >= 1
    else:
        assert calls == 0
    # One stream of events: the counters inspect stats shows agree with the metrics.
    assert gate_stats(run, worker)["fair-admitted"] == 5
    # A fairness key is never a label with fair_metrics_top_keys = 0.
    assert not any(secret in str(labels) for _, labels in [*during, *after])


def test_the_wait_of_each_keys_oldest_held_job_shows_for_the_keys_waiting_longest(
    make_run, start_worker
):
    # Given a worker that names the 2 keys that have waited longest,
    run = make_run(conf={"fair_metrics_port": 0, "fair_metrics_top_keys": 2})
    worker = start_worker(run, concurrency=1)
    port = gate_stats(run, worker)["fair-metrics-port"]
    # when its one process runs a long job and keys a, b and c each wait behind it, a first,
    run.send("fairapp.clone", "busy", 2.0, headers=fair_headers("clone", "z", "r0"))
    wait_until(lambda: run.recorder.events(), 20, "the busy job to start")
    for held, key in enumerate("abc", 1):
        run.send("fairapp.clone", key, 0.01, headers=fair_headers("clone", key, f"r-{key}"))
        wait_until(
            lambda n=held: sample(scrape(port), "celery_fair_held_jobs", **CLONE) == n,
            20,
            f"{key} to be held",
        )

    def named():
        s = scrape(port)
        waits = {k: sample(s, "celery_fair_key_head_wait_seconds", key=k) for k in "abc"}
        return s if waits["a"] is not None and waits["a"] >= 0.5 else None

    # then the two that have waited longest are named, each with its wait, and c as other,
    during = wait_until(named, 20, "a's wait to show", show=lambda: scrape(port))
    a, b = (sample(during, "celery_fair_key_head_wait_seconds", key=k) for k in "ab")
    other = sample(during, "celery_fair_key_head_wait_seconds", key="other")
    assert a >= b >= other >= 0
    assert sample(during, "celery_fair_key_head_wait_seconds", key="c") is None
    # and once they have run, no key is left.
    wait_until(lambda: len(run.recorder.done_counts()) == 4, 30, "every job")

    def nothing_held():
        s = scrape(port)
        return s if not sample(s, "celery_fair_held_jobs", **CLONE) else None

    after = wait_until(nothing_held, 20, "nothing held")
    assert not [k for (n, k) in after if n == "celery_fair_key_head_wait_seconds"]
    # Each start's wait at the head of its key's queue: the first two keys started here by
    # name (z, then a), b and c as other; a's, behind the busy job, over half a second.
    hist = "celery_fair_key_head_wait_to_start_seconds"
    counts = {k: sample(after, f"{hist}_count", key=k) for k in ("z", "a", "b", "c", "other")}
    assert counts == {"z": 1, "a": 1, "b": None, "c": None, "other": 2}
    assert sample(after, f"{hist}_sum", key="a") >= 0.5


def test_the_intakes_moves_show_by_queue_as_inspect_stats_counts_them(make_run, start_worker):
    # Given messages a producer that knows nothing of shards published to the queue itself,
    # two long ones first (a worker that takes its queue in faster than the intake looks, as
    # CI saw, would leave the intake nothing to move: the long ones keep its processes busy,
    # and fair_max_held its window full),
    run = make_run(conf={"fair_metrics_port": 0, "fair_max_held": 5})
    for i in range(2):
        run.send("fairapp.clone", f"long{i}", 3.0, headers=fair_headers("clone", "h", f"r{i}"))
    for i in range(200):
        run.send("fairapp.clone", f"j{i}", 0.001, headers=fair_headers("clone", f"k{i % 9}"))
    # when a worker starts, its intake moves them (those its consumer does not take first),
    worker = start_worker(run, concurrency=2)
    port = gate_stats(run, worker)["fair-metrics-port"]
    wait_until(lambda: len(run.recorder.done_counts()) == 202, 60, "every job")
    moved = gate_stats(run, worker)["fair-moved"]
    assert moved > 0
    # and the metric counts the same moves, under the queue they came from.
    assert sample(scrape(port), "celery_fair_intake_moved_total", queue=run.queue) == moved


def test_a_port_in_use_is_logged_and_the_worker_runs_without_metrics(make_run, start_worker):
    run = make_run(conf={"fair_metrics_port": 0})
    first = start_worker(run, concurrency=1)
    taken = gate_stats(run, first)["fair-metrics-port"]
    run.conf["fair_metrics_port"] = taken
    second = start_worker(run, concurrency=1)
    assert "cannot serve metrics" in second.log()
    run.send("fairapp.clone", "runs", 0.01, headers=fair_headers("clone", "k"))
    wait_until(lambda: run.recorder.done_counts().get("runs"), 20, "the job")
    assert "fair-metrics-port" not in gate_stats(run, second)


def test_each_keys_slots_by_its_policy_show_in_the_metrics_and_inspect_stats(
    make_run, start_worker
):
    # Given a worker whose key "w" weighs 8,
    run = make_run(conf={"fair_metrics_port": 0, "fair_keys": {"w": {"weight": 8}}})
    worker = start_worker(run, concurrency=1)
    port = gate_stats(run, worker)["fair-metrics-port"]
    # when its one process runs a long job of z and w and b hold three jobs each behind it,
    run.send("fairapp.clone", "busy", 2.0, headers=fair_headers("clone", "z", "r0"))
    wait_until(lambda: run.recorder.events(), 20, "the busy job to start")
    for key in "wb":
        for i in range(3):
            run.send("fairapp.clone", f"{key}{i}", 0.01, headers=fair_headers("clone", key, None))
    wait_until(
        lambda: sample(scrape(port), "celery_fair_held_jobs", **CLONE) == 6, 20, "6 held jobs"
    )
    # then both show the slots seed 001's allocation gives each key of this worker's.
    stats = gate_stats(run, worker)
    want = allocate(
        stats["fair-slots"] + stats["fair-lookahead"],  # what the core allocates
        {
            "z": KeyDemand(1, 0, None, 1),
            "w": KeyDemand(8, 0, None, 3),
            "b": KeyDemand(1, 0, None, 3),
        },
    ).slots
    assert stats["fair-key-allocation"] == want
    scraped = scrape(port)
    assert {k: sample(scraped, "celery_fair_key_allocation_slots", key=k) for k in want} == want
    assert want["w"] > want["b"]  # with weight 1, b would win the tie (by name)
    # Seed 001's views: z runs its 1 job on its share, the held ones by effective priority,
    # and the allocation's changes (keys came: at least z's and w's) once a sweep saw them.
    if want["z"]:
        assert sample(scraped, "celery_fair_key_allocation_utilization", key="z") == 1 / want["z"]
    waiting = sample(scraped, "celery_fair_held_jobs", **CLONE) - (
        sample(scraped, "celery_fair_reserved_jobs") or 0
    )  # (held, less those admitted into the reserve)
    assert sample(scraped, "celery_fair_pending_effective_priority_jobs", priority="8") == waiting
    assert sample(scraped, "celery_fair_allocation_redistributed_slots") >= 0
    changes = wait_until(
        lambda: (n := sample(scrape(port), "celery_fair_allocation_changes_total")) and n >= 2,
        20,
        "a sweep to see the allocation change",
    )
    assert changes
    assert gate_stats(run, worker)["fair-allocation-changes"] >= changes
