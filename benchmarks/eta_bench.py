"""How far a held job's expected start (``fair job``'s ETA) is from when it really started.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/eta_bench.py                       # Redis broker, 3 runs
    python benchmarks/eta_bench.py --broker amqp --runs 1
    python benchmarks/eta_bench.py --when mixed          # once every client's jobs are held
    python benchmarks/eta_bench.py --when queued         # jobs still in the broker

Each run starts one ``celery worker -P fair -c 2`` (burst_app.py) on a fresh queue, teaches it
the jobs' time with a warm-up of 40 jobs, then three clients publish 30 jobs each, of 50 to
350 ms (uniform, a fixed seed per run), all at once. Once the gate holds at least 6 of them
(it holds a window of them, the rest waits in the broker's shards: operations.md), one
``fair_status`` broadcast asks for every job: each held job's ``expected_wait`` (the work
ahead of it here shared by the slots, ``Scheduler.expected_wait``) gives its predicted start.
With ``--when mixed`` it asks once the gate holds jobs of every client instead (the burst's
first jobs are all client A's). When all have run, each prediction is compared with the start
the job recorded. With ``--when queued`` producers track their submissions
(``fair_track_submits``) and each client publishes 60 jobs; once every client's rate of ends is
known (a second after its first end), the jobs that no worker holds yet (in the broker) are
read from the registry (``Store.queued``): each one's ``expected_wait`` is its key's jobs ahead
of it at its key's rate of ends (``Queued.expected_wait``, what ``fair job`` says of a queued
job). The table gives,
per run, the median and 90th percentile of |actual - predicted|, the median of actual -
predicted (positive: later than predicted), the median actual wait, and the median of |error| /
actual wait for the jobs that waited at least 1 s.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
BROKERS = {
    "redis": "redis://127.0.0.1:6379/4",
    "amqp": "amqp://guest:guest@127.0.0.1:5672//",
}
RECORD = "redis://127.0.0.1:6379/0"
CLIENTS = ("A", "B", "C")


def app_for(broker: str, queue: str, key: str) -> Any:
    sys.path.insert(0, str(HERE))
    os.environ.update(BURST_BROKER=broker, BURST_QUEUE=queue, BURST_KEY=key, BURST_SHARDS="8")
    if broker.startswith("amqp"):
        os.environ["BURST_STORE"] = "redis://127.0.0.1:6379/4"
    import importlib

    import burst_app

    return importlib.reload(burst_app)


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def run_once(broker: str, seed: int, when: str) -> tuple[float, list[tuple[float, float]]]:
    """When the jobs were asked for, and (predicted start, actual start) per job asked about,
    in epoch seconds."""
    queue = f"eta-{uuid.uuid4().hex[:8]}"
    key = f"eta-{queue}"
    mixed = when == "mixed"
    queued = when == "queued"
    os.environ["BURST_SETTINGS"] = "{'fair_track_submits': True}" if queued else ""
    module = app_for(BROKERS[broker], queue, key)
    app, job = module.app, module.job
    record = redis.Redis.from_url(RECORD)
    command = [sys.executable, "-m", "celery", "-A", "burst_app", "worker", "-P", "fair"]
    command += ["-c", "2", "-Q", queue, "-n", f"eta-{queue}@%h", "--without-mingle"]
    command += ["--without-gossip", "-l", "WARNING"]
    worker = subprocess.Popen(
        command,
        cwd=HERE,
        env=dict(os.environ),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    rng = random.Random(seed)
    try:
        wait_for(lambda: app.control.ping(timeout=0.5), 60, "the worker")
        for _ in range(40):
            job.apply_async(["warm", rng.uniform(0.05, 0.35)], fairness_key="warm")
        wait_for(lambda: record.zcard(f"{key}:end:warm") == 40, 120, "the warm-up")
        ids = []
        for client in CLIENTS:
            for _ in range(60 if queued else 30):
                ids.append(
                    job.apply_async([client, rng.uniform(0.05, 0.35)], fairness_key=client).id
                )

        moment: list[float] = []

        def held() -> dict[str, Any] | None:
            before = time.time()
            replies = app.control.broadcast(
                "fair_status", arguments={"ids": ids}, reply=True, timeout=1.0
            )
            found = {k: v for r in replies for answer in r.values() for k, v in answer.items()}
            waiting = {k: v for k, v in found.items() if v.get("expected_wait") is not None}
            if len(waiting) < 6:
                return None
            keys = {answer["fairness_key"] for answer in waiting.values()}
            if mixed and not keys >= set(CLIENTS):
                return None
            # the worker answered within the broadcast's first moments: its reply came at
            # once, the broadcast then waited out its timeout for other workers
            moment.append(before)
            return waiting

        if queued:
            waiting = wait_for(lambda: in_the_broker(app, ids, moment), 60, "rates of ends")
        else:
            waiting = wait_for(held, 60, "the burst to be held")
        asked = moment[0]
        ends = lambda: sum(record.zcard(f"{key}:end:{c}") for c in CLIENTS)  # noqa: E731
        wait_for(lambda: ends() == len(ids), 300, "the burst to run")
        starts: dict[str, float] = {}
        for client in CLIENTS:
            for task_id, at in record.zrange(f"{key}:start:{client}", 0, -1, withscores=True):
                starts[task_id.decode()] = at
        return asked, [
            (asked + answer["expected_wait"], starts[task_id])
            for task_id, answer in waiting.items()
            if task_id in starts
        ]
    finally:
        os.kill(worker.pid, signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
        for name in record.scan_iter(match=f"{key}:*"):
            record.delete(name)
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
        app.close()


def in_the_broker(app: Any, ids: list[str], moment: list[float]) -> dict[str, Any] | None:
    """Once every client's rate of ends is known: the jobs no worker holds, each with its
    ``expected_wait`` from the registry (``None`` before)."""
    from celery_fair.submissions import tracked_store

    store = tracked_store(app)
    before = time.time()
    found = {task_id: store.queued(task_id) for task_id in ids}
    rates = {q.fairness_key: q.rate for q in found.values() if q is not None}
    if len(rates) < len(CLIENTS) or not all(rates.values()):
        return None
    replies = app.control.broadcast("fair_status", arguments={"ids": ids}, reply=True, timeout=1.0)
    at_worker = {k for r in replies for answer in r.values() for k in answer}
    moment.append(before)
    return {
        task_id: {"expected_wait": q.expected_wait}
        for task_id, q in found.items()
        if q is not None and task_id not in at_worker and q.expected_wait is not None
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", default="redis", choices=sorted(BROKERS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--when",
        default="first",
        choices=("first", "mixed", "queued"),
        help="ask once 6 jobs are held (first), once every client's jobs are (mixed), or of "
        "the jobs still in the broker once every client's rate of ends is known (queued)",
    )
    args = parser.parse_args()
    print(
        "run  jobs  median |err|  p90 |err|  median err  median wait"
        "  median |err|/wait (wait >= 1 s)"
    )
    for run in range(args.runs):
        asked, pairs = run_once(args.broker, seed=run, when=args.when)
        errors = sorted(abs(actual - predicted) for predicted, actual in pairs)
        waits = [actual - asked for _, actual in pairs]
        relative = [
            abs(actual - predicted) / (actual - asked)
            for predicted, actual in pairs
            if actual - asked >= 1.0
        ]
        p90 = errors[int(0.9 * (len(errors) - 1))]
        signed = statistics.median(actual - predicted for predicted, actual in pairs)
        print(
            f"{run:>3}  {len(pairs):>4}  {statistics.median(errors):>10.2f} s  {p90:>7.2f} s"
            f"  {signed:>+8.2f} s"
            f"  {statistics.median(waits):>9.2f} s  "
            f"{statistics.median(relative) if relative else float('nan'):>8.0%}"
        )


if __name__ == "__main__":
    main()
