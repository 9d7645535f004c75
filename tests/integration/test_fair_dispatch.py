"""Fair dispatch through real ``celery worker -P fair`` processes, on Redis and on RabbitMQ."""

from __future__ import annotations

import time

from harness import intervals, max_overlap, wait_until

from celery_fair import fair_headers

SLOTS = 2


def starts(run):
    return [e for e in run.recorder.events() if e["event"] == "start"]


def test_client_b_is_not_stuck_behind_client_a_burst(make_run, start_worker):
    # Given a worker, and client A's burst of 500 jobs just published (most of it still in
    # the broker, in A's shard),
    run = make_run()
    start_worker(run, concurrency=SLOTS)
    clone = run.app.tasks["fairapp.clone"]
    for i in range(500):
        clone.apply_async([f"A{i}", 0.02], fairness_key="A", job_id=f"a{i}")
    # When client B publishes two jobs right after,
    published = time.time()
    for i in range(2):
        clone.apply_async([f"B{i}", 0.02], fairness_key="B", job_id=f"b{i}")
    wait_until(lambda: run.recorder.done_counts().get("B1"), 30, "B's jobs to finish")
    # Then both start before A has started more than one more job per slot, and the one whose
    # start makes room for B's message (on Redis the gate holds only what it can start plus
    # one per shard, so B's message is fetched at the next start: operations.md#prefetch-qos).
    events = starts(run)
    b_started = max(e["t"] for e in events if e["tag"].startswith("B"))
    a_between = [e for e in events if e["tag"].startswith("A") and published < e["t"] < b_started]
    assert len(a_between) <= SLOTS + 1, a_between


def test_plain_celery_makes_client_b_wait_for_client_a(make_run, start_worker):
    # The same burst through a plain prefork worker: B waits behind (nearly) all of A.
    run = make_run()
    for i in range(500):
        run.send("fairapp.clone", f"A{i}", 0.005, headers=fair_headers("clone", "A", f"a{i}"))
    for i in range(2):
        run.send("fairapp.clone", f"B{i}", 0.005, headers=fair_headers("clone", "B", f"b{i}"))
    start_worker(run, pool="prefork", concurrency=SLOTS)
    wait_until(lambda: run.recorder.done_counts().get("B1"), 60, "B's jobs to finish")
    events = starts(run)
    b_started = min(e["t"] for e in events if e["tag"].startswith("B"))
    a_before = [e for e in events if e["tag"].startswith("A") and e["t"] < b_started]
    assert len(a_before) >= 450


def test_foreground_starts_as_soon_as_a_slot_frees_while_background_fills_its_tier(
    make_run, start_worker
):
    # Given background work (tier cap 2) saturating its tier on a 3-slot worker,
    run = make_run()
    start_worker(run, concurrency=3)
    for i in range(8):
        run.send(
            "fairapp.maintenance",
            f"bg{i}",
            1.0,
            headers=fair_headers("maintenance", "", f"repo{i}"),
        )
    wait_until(lambda: len(starts(run)) >= 2, 20, "background to start")
    # When a foreground job is published later, it starts at once: the third slot is free.
    published = time.time()
    run.send("fairapp.clone", "fg", 0.01, headers=fair_headers("clone", "dev1", "other"))
    wait_until(lambda: run.recorder.done_counts().get("fg"), 20, "the foreground job")
    fg_start = next(e["t"] for e in starts(run) if e["tag"] == "fg")
    assert fg_start - published < 0.5
    wait_until(lambda: len(run.recorder.done_counts()) == 9, 30, "everything to finish")
    bg = intervals(run.recorder.events(), "maintenance")
    assert max_overlap(list(bg.values())) == 2  # the tier cap, never more


def test_conflicting_jobs_never_overlap_and_others_run_in_parallel(make_run, start_worker):
    run = make_run()
    start_worker(run, concurrency=4)
    for i in range(6):
        run.send("fairapp.clone", f"linux{i}", 0.2, headers=fair_headers("clone", f"k{i}", "linux"))
        run.send(
            "fairapp.maintenance",
            f"linux-m{i}",
            0.2,
            headers=fair_headers("maintenance", "", "linux"),
        )
        run.send("fairapp.clone", f"other{i}", 0.2, headers=fair_headers("clone", "k", f"r{i}"))
    wait_until(lambda: len(run.recorder.done_counts()) == 18, 60, "all 18 jobs")
    spans = intervals(run.recorder.events())
    linux = [spans[t] for t in spans if t.startswith("linux")]
    assert max_overlap(linux) == 1
    others = [spans[t] for t in spans if t.startswith("other")]
    assert max_overlap(others) >= 2
