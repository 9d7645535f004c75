"""``fair_lookahead``: jobs admitted ahead of a free slot wait in the gate's reserve.

One starts the moment a process frees, with no store round trip in between; the pool never
runs more than its size, conflicts still never overlap, and a newcomer that ranks first takes
the place of reserved jobs that would hold it up longer than ``fair_reserve_seconds``, so it
waits no longer than without a lookahead, give or take that bound.

Here with real pools, real timings and store calls gathered on the event loop; the reserve's
rules on the gate alone (a set lookahead stays, the default one follows the jobs' wall times, a
newcomer takes the reserved place unless within the bound) are tests/unit/test_gate_reserve.py's.
"""

from __future__ import annotations

import math
import time

import pytest
from harness import BROKERS, gate_stats, intervals, max_overlap, wait_until

from celery_fair import fair_headers
from celery_fair.worker.pacing import GATHER_SECONDS

SLOTS = 2
LOOKAHEAD = 1
# A's jobs are long enough that counting those that start before B is a question of order (B
# goes first once the gate sees it), not of how fast B's message crosses a noisy machine.
A_SECONDS = 0.1


def starts(run):
    return [e for e in run.recorder.events() if e["event"] == "start"]


def burst_then_newcomer(run, worker, jobs, repos, seconds=A_SECONDS):
    """Client A's ``jobs`` jobs of ``seconds`` over ``repos`` repos, then client B's two right
    after.

    Returns when every job ran, with when B published."""
    clone = run.app.tasks["fairapp.clone"]
    for i in range(jobs):
        clone.apply_async([f"A{i}", seconds], fairness_key="A", job_id=f"r{i % repos}")
    published = time.time()  # right after: most of A's jobs are still in the broker
    for i in range(2):
        clone.apply_async([f"B{i}", 0.02], fairness_key="B", job_id=f"b{i}")
    wait_until(lambda: len(run.recorder.done_counts()) == jobs + 2, 60, "every job")
    return published


def assert_line_guarantees(run, published, jobs, repos, gathered=0):
    """The pool never ran more than its size, jobs on one repo never overlapped, and B waited
    behind at most one job per slot and those being admitted when it came (at most one per
    slot), plus ``gathered`` (what the slots start while a store call waits to gather): not
    A's backlog, and not the reserve, whose jobs B takes the place of."""
    spans = intervals(run.recorder.events())
    assert max_overlap(list(spans.values())) == SLOTS
    for repo in range(repos):
        assert max_overlap([spans[f"A{i}"] for i in range(repo, jobs, repos)]) == 1
    b_started = max(spans[f"B{i}"][0] for i in range(2))
    a_between = [
        t for t, (s, _) in spans.items() if t.startswith("A") and published < s < b_started
    ]
    assert len(a_between) <= 2 * SLOTS + gathered, a_between


def test_jobs_in_line_keep_the_pool_size_conflicts_and_fairness(make_run, start_worker):
    # Given a worker with a lookahead holding client A's 60 jobs, three per repo,
    run = make_run(conf={"fair_lookahead": LOOKAHEAD})
    worker = start_worker(run, concurrency=SLOTS)
    # when client B publishes two jobs right after,
    published = burst_then_newcomer(run, worker, 60, 20)
    # then the line was as deep as set, and every guarantee held.
    stats = gate_stats(run, worker)
    assert (stats["fair-slots"], stats["fair-lookahead"]) == (SLOTS, LOOKAHEAD)
    assert_line_guarantees(run, published, 60, 20)


def test_a_deep_line_gathers_store_calls_and_keeps_every_guarantee(make_run, start_worker):
    # Given a worker on the shared Redis store with a line of 4 (its store calls wait until the
    # line is down to 1, or GATHER_SECONDS) and client A's 90 jobs of 20 ms, three per repo,
    lookahead, seconds = 4, 0.02
    run = make_run(conf={"fair_lookahead": lookahead, "fair_store_url": BROKERS["redis"]})
    worker = start_worker(run, concurrency=SLOTS)
    # when client B publishes two jobs right after,
    published = burst_then_newcomer(run, worker, 90, 30, seconds)
    # then one store call served several jobs (about one per job without the gathering),
    stats = gate_stats(run, worker)
    assert stats["fair-store-calls"] < 0.75 * stats["fair-admitted"], stats
    # and every guarantee held, B's decision waiting at most one gathering (while each slot
    # may start another of A's short jobs).
    assert_line_guarantees(run, published, 90, 30, SLOTS * math.ceil(GATHER_SECONDS / seconds))


def busy_then_reserved(run, worker):
    """One process busy for 1.5 s with client A's job, and A's next job admitted behind it."""
    run.send("fairapp.clone", "busy", 1.5, headers=fair_headers("clone", "A", "r0"))
    wait_until(lambda: starts(run), 20, "the busy job to start")
    reserved = run.send("fairapp.clone", "next", 0.01, headers=fair_headers("clone", "A", "r1"))
    wait_until(
        lambda: gate_stats(run, worker).get("fair-reserved") == 1, 20, "the job to be reserved"
    )
    return reserved


def test_a_job_revoked_while_reserved_is_released_and_never_runs(make_run, start_worker):
    # Given one process busy for 1.5 s and a job admitted behind it, reserved,
    run = make_run(conf={"fair_lookahead": LOOKAHEAD})
    worker = start_worker(run, concurrency=1)
    reserved = busy_then_reserved(run, worker)
    # when it is revoked before its turn,
    reserved.revoke()
    run.send("fairapp.clone", "after", 0.01, headers=fair_headers("clone", "A", "r2"))
    # then it never runs, its place is given back, and the next job runs.
    wait_until(lambda: run.recorder.done_counts().get("after"), 30, "the job after it")
    assert "next" not in run.recorder.done_counts()
    wait_until(lambda: gate_stats(run, worker).get("fair-running") == 0, 20, "no job counted")


@pytest.mark.parametrize("broker", ["redis"])  # the pool's timing, whatever the broker
def test_the_default_reserve_is_deep_for_short_jobs_and_one_for_long_ones(make_run, start_worker):
    # Given a worker on the shared Redis store with the default (adaptive) reserve (how deep
    # for which wall times, exactly, is tests/unit/test_gate_reserve.py's; here the wall times
    # a real pool measures),
    run = make_run(conf={"fair_store_url": BROKERS["redis"]})
    worker = start_worker(run, concurrency=SLOTS)
    assert gate_stats(run, worker)["fair-lookahead"] == 1  # nothing timed yet
    # when it has run 60 jobs of about a millisecond, on 30 repos,
    for i in range(60):
        run.send("fairapp.clone", f"s{i}", 0.001, headers=fair_headers("clone", "A", f"r{i % 30}"))
    wait_until(lambda: len(run.recorder.done_counts()) == 60, 60, "the short jobs")
    # then it keeps several admitted ahead (2 processes free many slots in 10 ms), at most 8
    # (a millisecond's job measures a few on a loaded host: at least 2),
    short = gate_stats(run, worker)
    assert 2 <= short["fair-lookahead"] <= 8, short
    assert short["fair-slots"] == SLOTS
    # and after 12 jobs of 0.3 s, one: a second would wait about 0.15 s, far past 10 ms.
    for i in range(12):
        run.send("fairapp.clone", f"l{i}", 0.3, headers=fair_headers("clone", "A", f"q{i}"))
    wait_until(lambda: len(run.recorder.done_counts()) == 72, 60, "the long jobs")
    long = gate_stats(run, worker)
    assert long["fair-lookahead"] == 1, long
    # The pool never ran more than its size, whatever the depth.
    assert max_overlap(list(intervals(run.recorder.events()).values())) <= SLOTS
