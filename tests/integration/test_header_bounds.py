"""Headers a producer sets that the worker bounds: ``fair_submitted`` within the horizon before
receipt, ``fair_priority`` among the declared priorities; the caps hold either way."""

from __future__ import annotations

from harness import gate_stats, intervals, max_overlap, wait_until

from celery_fair import fair_headers


def test_a_forged_submission_time_gains_only_the_horizon_and_the_keys_cap_holds(
    make_run, start_worker
):
    # Given key k capped at one job at once, a worker with two slots, and the rescan type,
    # which ages to urgent (passing its key's cap) after 1 + 6 * 0.5 = 4 s of waiting,
    run = make_run(
        conf={"fair_keys": {"k": {"max_concurrency": 1}}, "fair_submitted_horizon_seconds": 1.0}
    )
    worker = start_worker(run, concurrency=2)
    rescan = run.app.tasks["fairapp.rescan"]
    # when a producer stamps its jobs as submitted in 1970,
    for i in range(4):
        rescan.apply_async([f"r{i}", 0.4], fairness_key="k", headers={"fair_submitted": 1.0})
    # then each counts as submitted one second before its receipt: none turns urgent, k's
    # jobs run one at a time, and the repairs are counted, with one warning.
    wait_until(lambda: len(run.recorder.done_counts()) == 4, 30, "the four jobs")
    spans = intervals(run.recorder.events())
    assert max_overlap(list(spans.values())) == 1
    assert gate_stats(run, worker)["fair-repaired"] == 4
    assert worker.log().count("past the horizon") == 1


def test_an_undeclared_priority_runs_in_its_types_tier_under_that_tiers_cap(make_run, start_worker):
    # Given tier 8 (clone's) capped at one job at once, on a worker with two slots,
    run = make_run(conf={"fair_tier_caps": {8: 1}})
    worker = start_worker(run, concurrency=2)
    # when a producer that knows nothing of the declared tiers gives its clones a priority
    # of a billion (fair_headers has no app to check it against),
    for i in range(4):
        headers = fair_headers("clone", f"k{i}", f"r{i}", priority=10**9)
        run.send("fairapp.clone", f"c{i}", 0.3, headers=headers)
    # then they run at clone's priority, in its tier, one at a time; the repairs are counted,
    # with one warning.
    wait_until(lambda: len(run.recorder.done_counts()) == 4, 30, "the four jobs")
    spans = intervals(run.recorder.events())
    assert max_overlap(list(spans.values())) == 1
    assert gate_stats(run, worker)["fair-repaired"] == 4
    assert worker.log().count("is not a declared priority") == 1
