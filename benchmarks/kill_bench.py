"""What SIGKILL does to delivery on the Redis broker: lost and repeated jobs, and how long a
killed worker's messages take to come back. Real ``celery worker`` processes (the integration
tests' app, tests/integration/fairapp.py), the local Redis broker, a private prefix per run.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/kill_bench.py kills                 # 3 modes, 1,500 jobs each, ~4 min
    python benchmarks/kill_bench.py kills --modes intake --jobs 300 --kills 5   # ~1 min
    python benchmarks/kill_bench.py restore               # Kombu's defaults vs the advice

``kills``: two workers (``-c 2``) run 1,500 acks_late jobs of 20 ms, published to the queue at
a steady rate while one worker after the other is SIGKILLed (every ``--every`` seconds) and
started again; then, once nothing is killed any more, the jobs left come back (visibility
timeout 4 s, restore sweep every second) and run. Per job it counts the runs that ended. Three
modes, the same load: ``intake`` (fair workers; the intake moves the queue's fair messages into
their shards), ``no-intake`` (fair workers, ``fair_intake_interval = None``: they take the fair
messages from the queue themselves) and ``plain`` (plain Celery, ``-P prefork``). A job whose
message is in no list of the broker (queue, shards, Kombu's unacked record) and that never
ended is lost; ``twice`` counts jobs that ended twice or more. The message of a job whose body
ended but whose worker died before its ack reached Redis is delivered again: that is what
``acks_late`` promises (at least once), with or without celery-fair.

``restore``: a worker holding acks_late jobs is SIGKILLed while a second worker runs; the time
from the kill to the first of the killed worker's jobs starting again on the second worker,
polled every 50 ms, with ``visibility_timeout = 10`` and (a) Kombu's default restore options,
(b) the options docs/operations.md recommends. Each case is bounded (``--limit`` seconds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "integration"), str(ROOT / "tests")]

from harness import Run, Worker, wait_until  # noqa: E402

from celery_fair import fair_headers  # noqa: E402
from celery_fair.routing import shard_name  # noqa: E402

#: The restore options of the ``kills`` runs (as the integration tests' FAST_RESTORE).
FAST = {
    "visibility_timeout": 4,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
    "unacked_mutex_expire": 5,
}
#: What docs/operations.md recommends besides a ``visibility_timeout`` of your choice.
ADVISED = {"unacked_restore_interval": 5, "unacked_restore_throttle": 1, "unacked_mutex_expire": 60}
SHARDS = 8
MODES = ("intake", "no-intake", "plain")


def conf_for(mode: str, options: dict) -> dict:
    conf: dict = {"broker_transport_options": dict(options), "fair_lease_seconds": 3}
    if mode == "no-intake":
        conf["fair_intake_interval"] = None
    return conf


def left_in_broker(run: Run) -> set[str]:
    """The tags of the run's messages still somewhere in the broker: its queue, its shards
    (every priority step) and Kombu's unacked record."""
    client = redis.Redis.from_url(run.url)
    try:
        found: set[str] = set()
        lists = [run.queue, *(shard_name(run.queue, i) for i in range(SHARDS))]
        raw: list[bytes] = []
        for name in lists:
            for key in client.scan_iter(match=f"{run.prefix}:{name}*", count=1000):
                if client.type(key) == b"list":
                    raw += client.lrange(key, 0, -1)
        messages = [json.loads(body) for body in raw]
        messages += [json.loads(v)[0] for v in client.hvals(f"{run.prefix}:unacked")]
        for message in messages:
            found.add(str(message["headers"].get("argsrepr", "")).split("'")[1])
        return found
    finally:
        client.close()


def kills(mode: str, jobs: int, rate: float, every: float, count: int, logs: Path) -> dict:
    run = Run("redis", conf=conf_for(mode, FAST))
    pool = "prefork" if mode == "plain" else "fair"
    workers = [Worker(run, pool=pool, concurrency=2, log_dir=logs) for _ in range(2)]
    tags = [f"j{i}" for i in range(jobs)]
    try:
        for w in workers:
            w.start(60)
        done = threading.Event()

        def publish() -> None:
            gap = 1.0 / rate
            start = time.monotonic()
            for i, tag in enumerate(tags):
                delay = start + i * gap - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                run.send("fairapp.late", tag, 0.02, headers=fair_headers("late", f"k{i % 7}"))
            done.set()

        publisher = threading.Thread(target=publish)
        publisher.start()
        killed = 0
        kill_times: list[tuple[float, int]] = []
        try:
            while killed < count and not done.is_set():
                time.sleep(every)
                kill_times.append((time.time(), workers[killed % 2].pid))
                workers[killed % 2].kill()
                workers[killed % 2] = Worker(run, pool=pool, concurrency=2, log_dir=logs)
                killed += 1
                workers[(killed - 1) % 2].start(60)
        finally:
            publisher.join()
        # Nothing is killed any more: wait until every job ended, or nothing has ended for
        # 30 s (a lost job never ends).
        last, seen = time.monotonic(), -1
        while time.monotonic() - last < 30:
            ended = len(run.recorder.done_counts())
            if ended != seen:
                last, seen = time.monotonic(), ended
            if ended == jobs:
                break
            time.sleep(0.2)
        counts = run.recorder.done_counts()
        lost = [t for t in tags if t not in counts]
        still = left_in_broker(run) & set(lost)
        starts: dict[str, int] = {}
        for e in run.recorder.events():
            if e["event"] == "start":
                starts[e["tag"]] = starts.get(e["tag"], 0) + 1
        events = run.recorder.events()
        detail = {
            t: [(e["event"], e["ppid"], round(e["t"], 3)) for e in events if e["tag"] == t]
            for t in lost
        }
        return {
            "detail": detail,
            "killed at": [(round(t, 3), pid) for t, pid in kill_times],
            "mode": mode,
            "jobs": jobs,
            "kills": killed,
            "lost": len(lost) - len(still),
            "not yet back": len(still),
            "twice": sum(1 for n in counts.values() if n >= 2),
            "started again": sum(1 for t, n in starts.items() if n > counts.get(t, 0)),
            "lost tags": sorted(set(lost) - still),
        }
    finally:
        for w in workers:
            w.stop()
        run.cleanup()


def restore(label: str, options: dict, limit: float, logs: Path) -> float | None:
    """Seconds from a SIGKILL to the first of the killed worker's jobs starting again on
    another worker (None: not within ``limit`` seconds)."""
    run = Run("redis", conf=conf_for("intake", {"visibility_timeout": 10, **options}))
    victim = Worker(run, concurrency=1, log_dir=logs)
    survivor = Worker(run, concurrency=1, log_dir=logs, env={"FAIRAPP_SLEEP_CAP": "0.01"})
    try:
        victim.start(60)
        for i in range(3):
            run.send("fairapp.late", f"r{i}", 600.0, headers=fair_headers("late", "k"))
        wait_until(lambda: run.recorder.events(), 30, "a job to run on the victim")
        # Every message is recorded as unacked (none on its way: Kombu's own gap).
        client = redis.Redis.from_url(run.url)
        wait_until(lambda: client.hlen(f"{run.prefix}:unacked") == 3, 30, "3 unacked")
        client.close()
        # A second worker (its jobs cut short) starts, finds nothing to take, and the first
        # is killed: its 3 messages are Kombu's unacked record's, which the second worker's
        # restore sweeps put back once they are older than visibility_timeout.
        survivor.start(60)
        victim.kill()
        killed = time.time()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            again = [
                e["t"]
                for e in run.recorder.events()
                if e["event"] == "start" and e["ppid"] == survivor.pid
            ]
            if again:
                return min(again) - killed
            time.sleep(0.05)
        return None
    finally:
        for w in (victim, survivor):
            w.stop()
        run.cleanup()
        print(f"  ({label} done)", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    k = sub.add_parser("kills")
    k.add_argument("--modes", default=",".join(MODES))
    k.add_argument("--jobs", type=int, default=1500)
    k.add_argument("--rate", type=float, default=30.0, help="jobs published per second")
    k.add_argument("--every", type=float, default=5.0, help="seconds between two kills")
    k.add_argument("--kills", type=int, default=10)
    k.add_argument("--verbose", action="store_true", help="show each lost job's runs")
    r = sub.add_parser("restore")
    r.add_argument("--limit", type=float, default=150.0)
    r.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="kill-bench-"))
    if args.what == "kills":
        print(f"{'mode':<10} {'jobs':>5} {'kills':>5} {'lost':>5} {'twice':>6} {'again':>6}")
        for mode in args.modes.split(","):
            r = kills(mode, args.jobs, args.rate, args.every, args.kills, logs)
            print(
                f"{r['mode']:<10} {r['jobs']:>5} {r['kills']:>5} {r['lost']:>5} "
                f"{r['twice']:>6} {r['started again']:>6}"
                + (f"  (not yet back: {r['not yet back']})" if r["not yet back"] else "")
                + (f"  lost: {' '.join(r['lost tags'])}" if r["lost tags"] else ""),
                flush=True,
            )
            if args.verbose and r["lost tags"]:
                print(f"  kills: {r['killed at']}\n  lost: {r['detail']}")
    else:
        cases = {"kombu defaults": {}, "advised": ADVISED}
        print("visibility_timeout 10 s; seconds from SIGKILL to the first job back")
        for label, options in cases.items():
            times = [restore(label, options, args.limit, logs) for _ in range(args.repeat)]
            shown = ", ".join("-" if t is None else f"{t:.1f}" for t in times)
            got = [t for t in times if t is not None]
            middle = f"  median {statistics.median(got):.1f}" if got else ""
            print(f"{label:<16} {shown}{middle}  {options or ''}", flush=True)
    print(f"worker logs: {logs}")


if __name__ == "__main__":
    main()
