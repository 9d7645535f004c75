"""Cost learning in a real worker: an expensive key gets proportionally fewer starts."""

from __future__ import annotations

from harness import wait_until

from celery_fair import fair_headers


def test_key_with_ten_times_longer_jobs_gets_about_a_tenth_of_the_starts(make_run, start_worker):
    # Given two keys with a standing backlog, x's jobs taking 10x as long as y's, on one slot,
    run = make_run()
    for i in range(40):
        run.send("fairapp.late", f"x{i}", 0.3, headers=fair_headers("late", "x", "x"))
    for i in range(400):
        run.send("fairapp.late", f"y{i}", 0.03, headers=fair_headers("late", "y", "y"))
    start_worker(run, concurrency=1)
    # When enough has run for the estimates to converge and a window to be counted,
    wait_until(lambda: len(run.recorder.done_counts()) >= 150, 90, "150 jobs to finish")
    starts = [e["tag"][0] for e in run.recorder.events() if e["event"] == "start"]
    window = starts[40:150]  # after convergence: alpha=0.3 settles within a few runs of each
    # Then x gets about a tenth of y's starts.
    ratio = window.count("x") / window.count("y")
    assert 0.05 <= ratio <= 0.2, (ratio, window)
