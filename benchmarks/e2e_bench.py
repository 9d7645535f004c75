"""Plain Celery against ``-P fair`` with the shared store, end to end, in one go.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/e2e_bench.py                        # both brokers, 3 pairs, with a plot
    python benchmarks/e2e_bench.py --brokers redis --pairs 1 --quick

Per broker, in interleaved pairs (one plain run and one fair run back to back, the order
alternating), the same prefork pool and concurrency, the fair worker with the shared store (the
broker's Redis on Redis; the local Redis on RabbitMQ) and 8 shards:

- drain throughput of no-op and of 10 ms tasks (worker_bench.py's measurement, ``-c 2``);
- publish-to-start latency of a task published to an idle worker (``-c 2``), 100 tasks 20 ms
  apart, median and 95th percentile;
- the light client's wait: client A publishes 5,000 tasks of 20 ms, client B 2 right after;
  B's publish-to-start (burst_bench.py's measurement, one worker ``-c 4``).

Each is reported as the median over pairs of the fair/plain ratio with the spread (min to max),
so a noisy moment moves both sides of a pair. ``--plot FILE`` draws the ratios.
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
sys.path.insert(0, str(HERE))

import burst_bench  # noqa: E402
import worker_bench  # noqa: E402

LATENCY_TASKS = 100
LATENCY_GAP = 0.02


def latency(broker: str, mode: str, tasks: int) -> tuple[float, float]:
    """Median and p95 publish-to-start (seconds) of ``tasks`` tasks published one by one to
    an idle worker."""
    queue = f"e2e-{uuid.uuid4().hex[:8]}"
    key = f"e2e:{queue}"
    shards = 8 if mode == "fair" else 1
    module = burst_bench.app_for(burst_bench.BROKERS[broker], queue, key, shards)
    record = redis.Redis.from_url(burst_bench.RECORD)
    env = {**os.environ, "PYTHONPATH": str(HERE), "BURST_SHARDS": str(shards)}
    variant = "fair/8" if mode == "fair" else "plain"
    [proc] = burst_bench.start_workers(variant, "1x2", env, queue)
    try:
        deadline = time.time() + 60
        while not module.app.control.ping(timeout=0.5):
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"{mode} worker did not start")
        published = {}
        for _ in range(tasks):
            now = time.time()
            result = module.job.apply_async(["L", 0.0], fairness_key="L")
            published[result.id] = now
            time.sleep(LATENCY_GAP)
        limit = time.time() + 60
        while record.zcard(f"{key}:start:L") < tasks:
            if time.time() > limit:
                raise RuntimeError(f"{mode} worker did not start every task")
            time.sleep(0.05)
        starts = record.zrange(f"{key}:start:L", 0, -1, withscores=True)
        waits = sorted(score - published[tid.decode()] for tid, score in starts)
        return statistics.median(waits), waits[int(0.95 * (len(waits) - 1))]
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        record.delete(f"{key}:start:L", f"{key}:end:L")
        with module.app.connection_for_write() as conn:
            for name in (queue, *(f"{queue}.fair.{i}" for i in range(8))):
                conn.default_channel.queue_delete(name)
        module.app.close()


def one_pair(broker: str, first: str, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every measurement for plain and fair, in the order ``first`` then the other."""
    modes = ["plain", "fair"] if first == "plain" else ["fair", "plain"]
    got: dict[str, dict[str, float]] = {m: {} for m in modes}
    for mode in modes:
        worker_mode = "fair" if mode == "fair" else "plain"
        for task in ("noop", "10ms"):
            m = worker_bench.measure(broker, worker_mode, task, args.tasks, 2, "redis")
            got[mode][f"{task} throughput (tasks/s)"] = m.rate
        p50, p95 = latency(broker, mode, args.latency_tasks)
        got[mode]["publish-to-start p50 (ms)"] = 1000 * p50
        got[mode]["publish-to-start p95 (ms)"] = 1000 * p95
        variant = "fair/8" if mode == "fair" else "plain"
        r = burst_bench.run_once(broker, variant, "1x4", args.burst, False, args.patience)
        got[mode][f"light client's wait behind {args.burst} (ms)"] = (
            1000 * r.b_wait if r.b_wait is not None else 1000 * args.patience
        )
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="redis,amqp")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=2000, help="tasks per throughput run")
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--latency-tasks", type=int, default=LATENCY_TASKS)
    parser.add_argument("--patience", type=float, default=60.0)
    parser.add_argument("--quick", action="store_true", help="small runs, to check it works")
    parser.add_argument("--plot", help="draw the ratios to this .png")
    args = parser.parse_args()
    os.environ["BURST_STORE"] = worker_bench.STATES["redis"]  # the shared store on both brokers
    if args.quick:
        args.tasks, args.burst, args.latency_tasks = 200, 300, 20
    rows = []
    for broker in args.brokers.split(","):
        pairs = [
            one_pair(broker, "plain" if i % 2 == 0 else "fair", args) for i in range(args.pairs)
        ]
        for metric in pairs[0]["plain"]:
            plain = [p["plain"][metric] for p in pairs]
            fair = [p["fair"][metric] for p in pairs]
            ratios = [f / p if p else float("inf") for f, p in zip(fair, plain, strict=True)]
            rows.append((broker, metric, statistics.median(plain), statistics.median(fair),
                         statistics.median(ratios), min(ratios), max(ratios)))  # fmt: skip
    print(f"{'broker':6} {'measure':42} {'plain':>9} {'fair':>9} {'fair/plain':>10} {'spread':>15}")
    for broker, metric, plain, fair, ratio, low, high in rows:
        print(f"{broker:6} {metric:42} {plain:9.1f} {fair:9.1f} {ratio:10.3f} "
              f"{low:7.3f}-{high:<7.3f}")  # fmt: skip
    if args.plot:
        draw(rows, args.plot)


def draw(rows: list[tuple[str, str, float, float, float, float, float]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.5))
    labels = [f"{b}: {m}" for b, m, *_ in rows]
    ratios = [r for *_, r, _, _ in rows]
    lows = [r - lo for *_, r, lo, _ in rows]
    highs = [hi - r for *_, r, _, hi in rows]
    y = range(len(rows))
    ax.barh(y, ratios, xerr=[lows, highs], color="tab:green", alpha=0.7)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(list(y), labels, fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("-P fair with the shared store / plain Celery (median of pairs, min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
