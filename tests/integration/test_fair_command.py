"""``celery -A app fair status`` and ``top``: real workers, the real store and broker, and the
command run as users run it (a ``celery.commands`` entry point)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

from harness import HERE, wait_until

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
        assert [(k["key"], k["running"]) for k in store["keys"]] == [("tenant-a", 1)]
        [clone] = [t for t in store["types"] if t["type"] == "clone"]
        assert (clone["running"], clone["tier"]) == (1, 8)
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
