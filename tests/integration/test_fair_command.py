"""``celery -A app fair status`` and ``top``: real workers, the real store and broker, and the
command run as users run it (a ``celery.commands`` entry point)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from harness import HERE, Worker, gate_stats, wait_until
from test_fleet import fleet_conf

from celery_fair import fair_headers


def fair_command(run, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", "fairapp", "fair", *args],
        cwd=HERE,
        env={**run.env(), "COLUMNS": "160"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_status_and_top_show_the_fleet_the_gates_and_the_queues(make_run, start_worker):
    # Given a worker running a long job of tenant-a on linux, and another of its jobs on linux
    # held behind it,
    run = make_run()
    worker = start_worker(run, concurrency=2)
    node = f"{worker.name}@{socket.gethostname()}"
    run.send("fairapp.clone", "holder", 8.0, headers=fair_headers("clone", "tenant-a", "linux"))
    wait_until(lambda: run.recorder.events(), 20, "the holder to start")
    run.send("fairapp.clone", "waiter", 0.01, headers=fair_headers("clone", "tenant-a", "linux"))

    def held():
        out = fair_command(run, "status", "--json")
        assert out.returncode == 0, out.stderr
        state = json.loads(out.stdout)
        [gate] = [g for g in state["workers"] if g["worker"] == node]
        return state if gate["held"] == 1 else None

    # when `status --json` runs, it shows the gate holding the waiter for its conflict,
    state = wait_until(held, 20, "the waiter to be held")
    [gate] = [g for g in state["workers"] if g["worker"] == node]
    assert gate["blocked"]["conflict"] == 1
    assert gate["oldest_held"] > 0
    assert gate["running"] == 1
    # the queue with its shards,
    [queue] = [q for q in state["queues"] if q["queue"] == run.queue]
    assert queue["waiting"] == 0
    # and, with a shared store (the broker's Redis), the fleet: tenant-a runs one clone.
    if run.broker == "redis":
        store = state["store"]
        assert store["workers"] == 1
        assert [(k["key"], k["running"], k["share"]) for k in store["keys"]] == [
            ("tenant-a", 1, 1.0)
        ]
        [clone] = [t for t in store["types"] if t["type"] == "clone"]
        assert (clone["running"], clone["tier"]) == (1, 8)
        [tier] = [t for t in store["tiers"] if t["tier"] == 8]
        assert (tier["running"], tier["cap"]) == (1, 8)  # the cap in force: its priority
        assert store["jain_index"] == 1.0
    else:
        assert state["store"] is None  # RabbitMQ and no fair_store_url: each worker alone
    # `top --once` draws the same for people.
    out = fair_command(run, "top", "--once")
    assert out.returncode == 0, out.stderr
    assert node in out.stdout
    assert "conflict 1" in out.stdout
    if run.broker == "redis":
        assert "tenant-a" in out.stdout
        assert "Heaviest keys" in out.stdout


def test_a_bad_setting_is_a_clear_error_not_a_traceback(make_run):
    run = make_run(conf={"fair_store_outage": "panic"})
    out = fair_command(run, "status")
    assert out.returncode != 0
    assert "fair_store_outage" in out.stderr
    assert "Traceback" not in out.stderr


N = 30  # jobs recorded: 3 s of work on 2 slots, more than a worker holds at once


def test_record_writes_the_live_traffic_as_a_trace_the_simulator_replays(
    make_run, start_worker, tmp_path, broker
):
    # Given a worker (started without -E: record turns task events on, as Flower does), a
    # key policy in fair_keys, one set at run time and a key paused,
    run = make_run(conf=fleet_conf(broker, fair_keys={"alice": {"weight": 2}}))
    worker = start_worker(run, concurrency=2)
    for args in (("weights", "bob", "--weight", "3"), ("pause", "--key", "dave")):
        assert fair_command(run, *args).returncode == 0
    # (record sums the slots of every fair worker that answers the app's remote control: the
    # run's own control exchange makes that this test's worker alone; wait until it answers)
    ours = f"{worker.name}@{socket.gethostname()}"
    wait_until(
        lambda: fair_workers(run) == [ours], 60, "this test's worker to be the only fair one"
    )
    trace_path = tmp_path / "trace.json"
    log = tmp_path / "record.log"
    with open(log, "wb") as err:
        recording = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "fairapp", "fair", "record",
             "--out", str(trace_path), "--for", "8s"],
            cwd=HERE, env=run.env(), stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        wait_until(lambda: "recording for" in log.read_text(), 30, "the recorder to listen",
                   show=log.read_text)  # fmt: skip
        # when three clients' jobs run while it records, published in one burst (which the
        # worker takes from the broker over seconds, two slots at a time),
        published = time.time()
        for i in range(N):
            key = ("alice", "bob", "carol")[i % 3]
            run.send("fairapp.clone", f"j{i}", 0.2, headers=fair_headers("clone", key, f"r{i}"))
        publishing = time.time() - published
        wait_until(lambda: len(run.recorder.done_counts()) == N, 30, "the jobs")
        assert recording.wait(30) == 0, log.read_text()
    finally:
        if recording.poll() is None:
            recording.kill()
            recording.wait()
    # then the trace holds each of them with its type, key, job id and run time,
    trace = json.loads(trace_path.read_text())
    assert trace["capacity"] == 2  # the worker's slots
    assert set(trace["types"]) == {"clone"}
    jobs = trace["jobs"]
    assert sorted((j["fairness_key"], j["job_id"]) for j in jobs) == sorted(
        (("alice", "bob", "carol")[i % 3], f"r{i}") for i in range(N)
    )
    assert all(0.15 <= j["duration"] < 5 for j in jobs)
    assert jobs[0]["arrival"] == 0
    # arriving when they were published (the burst as it was, not as the worker took it),
    assert jobs[-1]["arrival"] <= publishing + 1e-3, (jobs[-1]["arrival"], publishing)
    # under the policies in force: fair_keys and the runtime ones, and the pause,
    assert trace["keys"] == {"alice": {"weight": 2.0}, "bob": {"weight": 3.0}}
    assert trace["pauses"] == [{"key": "dave", "at": 0.0}]
    # and the simulator replays it.
    replay = subprocess.run(
        [sys.executable, "-m", "celery_fair", "simulate", str(trace_path), "--format", "table"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    assert "alice" in replay.stdout


def fair_workers(run) -> list[str]:
    """The fair workers that answer on the test's broker (their gates report ``fair-held``)."""
    stats = run.app.control.inspect(timeout=1).stats() or {}
    return sorted(node for node, info in stats.items() if "fair-held" in info.get("pool", {}))


def test_a_worker_shows_its_pool_slots_and_its_reserve_apart(make_run, start_worker):
    # Given a -c 2 worker with a reserve of 1, both processes busy and a third job admitted
    # into the reserve,
    run = make_run(conf={"fair_lookahead": 1})
    worker = start_worker(run, concurrency=2)
    node = f"{worker.name}@{socket.gethostname()}"
    for i in range(3):
        run.send("fairapp.clone", f"j{i}", 3.0, headers=fair_headers("clone", "a", f"r{i}"))

    def full() -> dict | None:
        stats = gate_stats(run, worker)
        return stats if stats.get("fair-reserved") == 1 else None

    stats = wait_until(full, 20, "the reserved job", show=lambda: gate_stats(run, worker))
    # then inspect stats counts the pool's two slots and the reserve apart (not "3 of 3"),
    assert (stats["fair-running"], stats["fair-slots"]) == (2, 2)
    assert (stats["fair-reserved"], stats["fair-lookahead"]) == (1, 1)
    assert "fair-capacity" not in stats
    # and so does `status --json` (while the jobs run: `top` draws it, in the unit tests).
    out = fair_command(run, "status", "--json")
    assert out.returncode == 0, out.stderr
    [gate] = [g for g in json.loads(out.stdout)["workers"] if g["worker"] == node]
    assert (gate["running"], gate["slots"], gate["reserved"], gate["lookahead"]) == (2, 2, 1, 1)


def test_at_the_default_log_level_a_fair_worker_says_it_runs_fair(make_run, tmp_path):
    # Given a -P fair worker started at celery worker's default log level (WARNING),
    run = make_run()
    worker = Worker(run, log_dir=tmp_path, concurrency=2, args=("-l", "WARNING"))
    with open(worker.log_path, "ab") as log:
        worker.proc = subprocess.Popen(
            worker.command, cwd=HERE, env=run.env(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        # then its output says, in one line, that it runs fair: the pool inside with its slots
        # and reserve, the store, the shards.
        line = wait_until(
            lambda: next((x for x in worker.log().splitlines() if "-P fair on" in x), None),
            30,
            "the startup line",
            show=worker.log,
        )
        assert f"-P fair on {worker.name}@" in line
        assert ": prefork pool inside, 2 slots and " in line
        if run.broker == "redis":  # the broker's Redis is the shared store
            assert "; store redis://" in line
        else:
            assert "; no shared store (this worker decides alone);" in line
        assert line.endswith(f"8 shards per queue ({run.queue})")
        assert "WARNING" not in line  # printed as the banner is, not logged as a warning
    finally:
        worker.stop()
