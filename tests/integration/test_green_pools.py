"""gevent and eventlet under the gate: started through ``python -m celery_fair_green``.

Green pools run the consumer's synchronous loop (Celery uses no event loop when the process is
patched), so these also cover the gate and the store without a hub on both brokers.
"""

from __future__ import annotations

import pytest
from harness import intervals, max_overlap, wait_until
from test_worker_startup import run_worker_to_exit

from celery_fair import fair_headers

GREEN = ["gevent", "eventlet"]


def start_green(start_worker, run, green: str, concurrency: int):
    return start_worker(
        run, concurrency=concurrency, launcher=("celery_fair_green", green), pool="fair"
    )


@pytest.mark.parametrize("green", GREEN)
def test_a_green_fair_worker_is_fair_keeps_conflicts_and_runs_plain_tasks(
    make_run, start_worker, broker, green
):
    # Given a green fair worker with 4 slots, where client A queued 12 jobs, two per repo,
    conf = {"fair_pool": green}
    if broker == "amqp":
        # Celery's loop for green pools waits up to 0.1 s per turn for the event connection's
        # heartbeats, so it takes in ~10 messages/s (plain -P gevent too): see operations.md.
        conf["broker_heartbeat"] = 0
    run = make_run(conf=conf)
    for i in range(12):
        run.send("fairapp.clone", f"a{i}", 0.2, headers=fair_headers("clone", "A", f"repo{i % 6}"))
    worker = start_green(start_worker, run, green, concurrency=4)
    assert f"({green})" in worker.log()  # the banner names the real pool
    wait_until(
        lambda: run.recorder.events(), 20, "A's first job", show=lambda: worker.log()[-6000:]
    )
    # When client B sends one job on a third repo, and a plain task comes along,
    run.send("fairapp.clone", "b", 0.01, headers=fair_headers("clone", "B", "repo9"))
    run.send("fairapp.plain", "plain", 0.01)
    wait_until(
        lambda: len(run.recorder.done_counts()) == 14,
        60,
        "every job",
        show=lambda: (run.recorder.done_counts(), worker.log()[-6000:]),
    )
    spans = intervals(run.recorder.events())
    # Then the slots were used, jobs on one repo never overlapped,
    assert max_overlap(list(spans.values())) == 4
    for repo in range(6):
        assert max_overlap([spans[f"a{repo}"], spans[f"a{repo + 6}"]]) == 1
    # and B did not wait for A's backlog: A started at most one more job per slot first.
    a_starts_before_b = sum(1 for i in range(12) if spans[f"a{i}"][0] < spans["b"][0])
    assert a_starts_before_b <= 4 + 4
    assert run.recorder.done_counts() == dict.fromkeys(
        [f"a{i}" for i in range(12)] + ["b", "plain"], 1
    )


@pytest.mark.parametrize("broker", ["redis"])
@pytest.mark.parametrize("green", GREEN)
def test_a_green_fair_pool_in_an_unpatched_process_stops_the_worker(make_run, green):
    run = make_run(conf={"fair_pool": green})
    proc = run_worker_to_exit(run)
    assert proc.returncode == 78
    assert f"python -m celery_fair_green {green} -A <app> worker -P fair" in proc.stderr
