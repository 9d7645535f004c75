"""The shared store goes away mid-run: a private redis-server, killed and restarted empty.

The broker is untouched (the shared Redis, or RabbitMQ); only the store's own Redis, started
by the test on a spare port, dies. Nothing escapes into Celery, nothing is lost, no cap is
exceeded, and after the restart the worker registers what it runs so the counts are right.
"""

from __future__ import annotations

import time

import redis
from harness import gate_stats, intervals, max_overlap, wait_until

from celery_fair import fair_headers


def starts(run):
    return [e for e in run.recorder.events() if e["event"] == "start"]


def store_counts(server, run):
    client = redis.Redis.from_url(server.url)
    try:
        return {k.decode(): int(v) for k, v in client.hgetall(f"{{{run.prefix}}}:types").items()}
    finally:
        client.close()


def clean_log(worker):
    log = worker.log()
    assert "Traceback" not in log, log[-3000:]
    assert "Unrecoverable" not in log, log[-3000:]


def test_hold_mode_rides_out_a_store_restart_and_registers_what_runs(
    make_run, start_worker, private_redis, broker
):
    run = make_run(
        conf={
            "fair_store_url": private_redis.url,
            "fair_lease_seconds": 3,
            "fair_store_poll_interval": 0.2,
        }
    )
    worker = start_worker(run, concurrency=3)
    # Given two long repacks running (type cap 2) and more work held behind them,
    for i in range(2):
        run.send("fairapp.repack", f"long{i}", 5.0, headers=fair_headers("repack", "", f"l{i}"))
    wait_until(lambda: len(starts(run)) == 2, 20, "the two long repacks to start")
    for i in range(6):
        run.send("fairapp.repack", f"r{i}", 0.3, headers=fair_headers("repack", "", f"r{i}"))
        run.send("fairapp.clone", f"c{i}", 0.3, headers=fair_headers("clone", "k", "linux"))
    wait_until(lambda: len(starts(run)) >= 3, 20, "a clone to start")
    # when the store's Redis dies (and jobs without any conflict arrive too),
    private_redis.kill()
    killed = time.time()
    for i in range(2):
        run.send("fairapp.snapshot", f"s{i}", 0.1, headers=fair_headers("snapshot", "", None))
    # (three failed calls: the outage lasts the backoff's first steps, some seconds)
    wait_until(
        lambda: gate_stats(run, worker).get("fair-store-failed", 0) >= 3, 30, "failed probes"
    )
    assert gate_stats(run, worker)["fair-store-mode"] == "hold"
    held_starts = len(starts(run))
    # then nothing new starts while it is gone (what was handed over before may still start),
    assert all(e["t"] < killed + 0.5 for e in starts(run)), starts(run)
    # and when it comes back empty, the worker registers the repacks still running,
    private_redis.start()
    restarted = time.time()
    wait_until(lambda: store_counts(private_redis, run).get("repack") == 2, 20, "registration")
    assert not run.recorder.done_counts().get("long0")
    # and then every job completes exactly once, no cap or conflict ever exceeded,
    wait_until(lambda: len(run.recorder.done_counts()) == 16, 60, "all sixteen jobs")
    assert set(run.recorder.done_counts().values()) == {1}
    events = run.recorder.events()
    assert max_overlap(list(intervals(events, "repack").values())) <= 2
    assert max_overlap(list(intervals(events, "clone").values())) == 1
    later = [e for e in starts(run) if e["t"] > restarted]
    assert len(later) == 16 - held_starts
    # with nothing left counted, and no exception anywhere in the worker.
    wait_until(lambda: store_counts(private_redis, run) == {}, 20, "the store to be empty")
    clean_log(worker)


def test_local_mode_keeps_running_on_its_share_but_never_a_conflicting_job(
    make_run, start_worker, private_redis, broker
):
    run = make_run(
        conf={
            "fair_store_url": private_redis.url,
            "fair_store_outage": "local",
            "fair_lease_seconds": 3,
            "fair_store_poll_interval": 0.2,
        }
    )
    worker = start_worker(run, concurrency=3)
    run.send("fairapp.snapshot", "warmup", 0.01, headers=fair_headers("snapshot", "", None))
    wait_until(lambda: run.recorder.done_counts().get("warmup"), 20, "the first job")
    # Given the store's Redis is gone,
    private_redis.kill()
    killed = time.time()
    # when snapshots (no conflict group, type cap 2) and clones on one repository arrive,
    for i in range(6):
        run.send("fairapp.snapshot", f"s{i}", 0.3, headers=fair_headers("snapshot", "", None))
        run.send("fairapp.clone", f"c{i}", 0.1, headers=fair_headers("clone", "k", "linux"))
    # then the snapshots run on this worker's share of their cap, the clones wait,
    wait_until(lambda: len(run.recorder.done_counts()) == 7, 30, "the snapshots")
    assert gate_stats(run, worker).get("fair-store-mode") == "local"
    assert not any(e["tag"].startswith("c") for e in starts(run))
    assert max_overlap(list(intervals(run.recorder.events(), "snapshot").values())) <= 2
    # and once the store is back, the clones run, one at a time.
    private_redis.start()
    wait_until(lambda: len(run.recorder.done_counts()) == 13, 30, "the clones")
    events = run.recorder.events()
    assert all(e["t"] > killed for e in events if e["tag"].startswith("c"))
    assert max_overlap(list(intervals(events, "clone").values())) == 1
    assert set(run.recorder.done_counts().values()) == {1}
    clean_log(worker)


def fenced_runs(run):
    return [e for e in run.recorder.events() if e["event"] == "end" and e["type"] == "fenced"]


def test_fencing_tokens_keep_rising_after_the_store_comes_back_empty_so_every_write_is_accepted(
    make_run, start_worker, private_redis, broker, tmp_path
):
    # docs/store.md's fencing recipe on one repository, with the store's Redis restarted
    # empty twice: once under a live worker, once with no worker left to remember anything.
    db = str(tmp_path / "repos.sqlite")
    run = make_run(
        conf={
            "fair_store_url": private_redis.url,
            "fair_lease_seconds": 2,
            "fair_store_poll_interval": 0.2,
        }
    )

    def send(tags):
        for tag in tags:
            run.send(
                "fairapp.fenced", tag, "linux", db, headers=fair_headers("locked", "k", "linux")
            )
        wait_until(
            lambda: {e["tag"] for e in fenced_runs(run)} >= set(tags),
            30,
            f"{tags} to run",
            show=lambda: fenced_runs(run),
        )

    def restart_empty():
        private_redis.kill()
        private_redis.start()

    # Given jobs that wrote with their tokens,
    worker = start_worker(run, concurrency=2)
    send(["a0", "a1", "a2"])
    # when the store comes back empty under the live worker, and then again with a fresh
    # worker started after it (nothing survives that saw the old tokens),
    restart_empty()
    send(["b0", "b1", "b2"])
    worker.stop()
    restart_empty()
    worker = start_worker(run, concurrency=2)
    send(["c0", "c1"])
    # then every job's write is accepted: each token is above every earlier one.
    runs = sorted(fenced_runs(run), key=lambda e: e["t"])
    assert [e["tag"][0] for e in runs] == list("aaabbbcc")
    assert all(e["written"] for e in runs), runs
    tokens = [e["token"] for e in runs]
    assert tokens == sorted(tokens), tokens
    assert len(set(tokens)) == len(tokens), tokens
    clean_log(worker)
