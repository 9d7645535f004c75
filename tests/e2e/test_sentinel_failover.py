"""The store's Sentinel master dies under a running worker; a Sentinel promotes the replica.

The broker is the shared Redis; the store is a Sentinel group of the test's own (a master, a
replica and a Sentinel on spare ports, tests/redis_sentinel.py), named by
``fair_store_url = "sentinel://..."``. The worker holds while the store is unreachable, finds
the new master through the Sentinel, and every job runs once; nothing escapes into Celery.
"""

from __future__ import annotations

import pytest
from harness import Run, Worker, gate_stats, intervals, max_overlap, wait_until

from celery_fair import fair_headers
from celery_fair.store import RedisStore
from redis_sentinel import running_sentinel


@pytest.fixture
def group(tmp_path_factory):
    with running_sentinel(tmp_path_factory) as started:
        yield started


def test_a_worker_rides_out_the_death_of_its_stores_master(group, tmp_path):
    run = Run(
        "redis",
        conf={
            "fair_store_url": group.url(),
            "fair_lease_seconds": 3,
            "fair_store_poll_interval": 0.2,
        },
    )
    worker = Worker(run, log_dir=tmp_path)
    try:
        worker.start()
        # Given a worker busy with a stream of jobs, half of them on one conflict,
        for i in range(12):
            run.send(
                "fairapp.clone", f"linux{i}", 0.15, headers=fair_headers("clone", "k", "linux")
            )
            run.send(
                "fairapp.clone", f"other{i}", 0.15, headers=fair_headers("clone", "j", f"o{i}")
            )
        wait_until(lambda: len(run.recorder.done_counts()) >= 4, 30, "the first jobs to end")
        # when the store's master dies, after what it had was replicated,
        old = group.master_port()
        with group.node(old) as master:
            master.execute_command("WAIT", 1, 5000)
        group.kill(old)
        # then the worker holds, finds the promoted replica, and every job runs, once,
        wait_until(lambda: len(run.recorder.done_counts()) == 24, 90, "all 24 jobs")
        assert set(run.recorder.done_counts().values()) == {1}
        assert group.master_port() != old
        spans = intervals(run.recorder.events())
        assert max_overlap([spans[t] for t in spans if t.startswith("linux")]) == 1
        stats = gate_stats(run, worker)
        assert stats["fair-store-outages"] >= 1
        assert stats["fair-store-mode"] == "shared"
        # and the new master counts nothing once the last ends are reported.
        store = RedisStore.from_url(group.url(), prefix=run.prefix)
        try:
            wait_until(
                lambda: store.heartbeat("probe", [], []).types == {}, 20, "nothing left counted"
            )
        finally:
            store.close()
        log = worker.log()
        assert "Traceback" not in log, log[-3000:]
    finally:
        worker.stop()
        run.cleanup()
