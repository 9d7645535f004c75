"""Worker throughput: plain Celery (``-P prefork``) against ``-P fair``, interleaved pairs.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/worker_bench.py                       # both brokers and states, 5 pairs
    python benchmarks/worker_bench.py --brokers redis --states redis --pairs 3 --quick
    python benchmarks/worker_bench.py --states redis --lookahead 0   # fair_lookahead = 0

Each measurement publishes N tasks to a fresh queue, starts a fresh ``celery worker`` process
(prefork either way, concurrency 2), and measures from the first task start to the N-th task end,
read from what the tasks record in Redis. The same fair tasks run in both modes: without the
fair pool their headers are simply ignored. A pair is one plain run and one fair run, back to
back, order alternating; the ratio reported is the median over pairs of fair/plain throughput.

``--states``: where the fair worker keeps its shared state: ``memory`` (this worker alone) or
``redis`` (the shared store: the broker's Redis on the Redis broker, the local Redis named by
``fair_store_url`` on RabbitMQ), each under a fresh prefix.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent
BROKERS = {
    "redis": "redis://127.0.0.1:6379/4",
    "amqp": "amqp://guest:guest@127.0.0.1:5672//",
}
RECORD = "redis://127.0.0.1:6379/0"
STATES = {"memory": "memory", "redis": "redis://127.0.0.1:6379/4"}


def bench_app(broker: str, queue: str, key: str):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(HERE))
    os.environ.update(BENCH_BROKER=broker, BENCH_QUEUE=queue, BENCH_KEY=key)
    import importlib

    import bench_app as module

    return importlib.reload(module)


def measure(
    broker: str,
    mode: str,
    task: str,
    n: int,
    concurrency: int,
    state: str,
    lookahead: int | None = None,
) -> float:
    """Tasks per second for one fresh worker running ``n`` pre-published tasks."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    key = f"bench:{queue}"
    module = bench_app(BROKERS[broker], queue, key)
    record = redis.Redis.from_url(RECORD)
    target = module.noop if task == "noop" else module.sleep10
    for i in range(n):
        target.apply_async(fairness_key=f"client{i % 10}", job_id=f"r{i % 50}")
    env = {
        **os.environ,
        "PYTHONPATH": str(HERE),
        "BENCH_STORE": STATES[state],
        "BENCH_LOOKAHEAD": "" if lookahead is None else str(lookahead),
    }
    pool = "fair" if mode == "fair" else "prefork"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench_app",
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-Q",
            queue,
            "--without-mingle",
            "--without-gossip",
            "-l",
            "WARNING",
        ],
        cwd=HERE,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 300
        while int(record.get(f"{key}:count") or 0) < n:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{mode} worker on {broker} did not finish")
            time.sleep(0.05)
        first = float(record.get(f"{key}:first") or 0)
        last = float(record.get(f"{key}:last") or 0)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        record.delete(f"{key}:count", f"{key}:first", f"{key}:last")
        store = redis.Redis.from_url(STATES["redis"])
        for stale in store.scan_iter(match=f"{{bench-{queue}}}:*"):
            store.delete(stale)
        with module.app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
    return (n - 1) / (last - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="redis,amqp")
    parser.add_argument("--states", default="memory,redis", help="memory and/or redis")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="few tasks, to check it runs")
    parser.add_argument(
        "--lookahead",
        type=int,
        default=None,
        help="fair_lookahead of the fair worker (default: the worker's own)",
    )
    args = parser.parse_args()
    sizes = {"noop": 300, "10ms": 100} if args.quick else {"noop": 3000, "10ms": 600}
    header = f"{'broker':6} {'state':6} {'task':5} {'plain/s':>9} {'fair/s':>9}"
    print(f"{header} {'fair/plain':>10}  pairs")
    for broker in args.brokers.split(","):
        for state in args.states.split(","):
            for task, n in sizes.items():
                plain, fair, ratios = [], [], []
                for i in range(args.pairs):
                    order = ("plain", "fair") if i % 2 == 0 else ("fair", "plain")
                    got = {
                        m: measure(broker, m, task, n, args.concurrency, state, args.lookahead)
                        for m in order
                    }
                    plain.append(got["plain"])
                    fair.append(got["fair"])
                    ratios.append(got["fair"] / got["plain"])
                print(
                    f"{broker:6} {state:6} {task:5} {statistics.median(plain):>9.0f} "
                    f"{statistics.median(fair):>9.0f} {statistics.median(ratios):>10.3f}  "
                    f"{' '.join(f'{r:.2f}' for r in ratios)}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
