"""Rate limits by fairness key on a real fleet: a key's starts against its rate over 60 s.

How closely two ``celery worker -P fair`` processes sharing one Redis store hold a key to its
rate over a minute, and how busy the other key's jobs keep the slots it leaves.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/rate_bench.py --quick                     # a 5 s window, to check it runs
    python benchmarks/rate_bench.py --runs 3                    # per job and per cost, Redis
    python benchmarks/rate_bench.py --brokers amqp --modes job  # RabbitMQ, the store on Redis
    python benchmarks/rate_bench.py --code /tmp/head/src        # another checkout's celery_fair
    python benchmarks/rate_bench.py --dump spans.json           # and every job's span, to look at

Each run publishes a backlog to a fresh queue, then starts two fresh ``celery worker -P fair
-c 2`` processes together (4 slots; the store is the broker's Redis on Redis, the local Redis
on RabbitMQ, under a fresh prefix). Key A is rate-limited and has more jobs than its rate lets
start in the window; key B has no limit and enough 0.2 s jobs to keep every slot A leaves
busy. The two are published interleaved, so neither's backlog sits in front of the other's.
Every job records its start and end in Redis (``time.time()``: one host, one clock). The
workers are stopped (SIGTERM to each PID, then SIGKILL to its process group) one second after
the window ends, and the run's keys are deleted by SCAN on its prefix (never FLUSHDB: the
Redis is shared); on RabbitMQ its queues are deleted.

Modes (``--modes``):

- ``job``: A at ``10/s``, burst 10, ``per: "job"``; A's jobs take 10 ms. Each start costs 1.
- ``cost``: A at ``1/s``, burst 10, ``per: "cost"``; A's jobs take 0.1 s (and say so as their
  ``default_cost``, so their first starts are charged what later ones are). Each start costs
  its learned estimate, so the promise is about 10 starts a second again, counted in seconds
  of work. (At ``10/s`` by cost, 10 ms jobs would be allowed 1,000 starts a second: no limit.)
- ``none``: the control, no A and no rate: how busy B's jobs alone keep the fleet over the
  window from the first start, on this host, the same measurement as ``busy`` below.

From A's first start ``a0``, for a window of ``--window`` seconds (60), with ``charge`` = 1 a
start (``job``) or the job's own duration, as the task measured it (``cost``: the store charges
its estimate, learned from the worker's slightly longer elapsed time):

- ``A/promise``: A's charges started in ``[a0, a0 + window]`` against ``rate * window + burst``,
  the most the bucket allows; ``after burst``: A's charge rate from ``a0 + burst / rate`` to the
  window's end against ``rate``;
- ``max 1 s`` and ``max 10 s``: the most charges started in any window of 1 s and 10 s (each
  window opening at one of A's starts) against ``rate * w + burst``;
- ``busy``: the slot-time all jobs used from when both workers had started a job (and A had)
  to A's last start in the window, against 4 slots for as long: how little the limit idles;
- ``split``: A's starts in the window by each worker (the bucket is the fleet's).

Each row of the summary is the median over runs with the spread (min-max).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import dataclasses
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
BROKERS = {
    "redis": "redis://127.0.0.1:6379/4",
    "amqp": "amqp://guest:guest@127.0.0.1:5672//",
}
STORE = "redis://127.0.0.1:6379/4"  # the store on RabbitMQ (on Redis: the broker's Redis)
RECORD = "redis://127.0.0.1:6379/0"
WORKERS = 2
B_SECONDS = 0.2


@dataclass(frozen=True)
class Mode:
    name: str
    rate: str  # as fair_keys takes it
    per_second: float
    burst: float
    per: str  # "job" or "cost"
    a_seconds: float  # how long each of A's jobs takes

    @property
    def starts_per_s(self) -> float:
        return self.per_second / self.a_seconds if self.per == "cost" else self.per_second

    @property
    def burst_starts(self) -> float:
        return self.burst / self.a_seconds if self.per == "cost" else self.burst

    def policy(self) -> dict[str, Any]:
        return {"rate": self.rate, "burst": self.burst, "per": self.per} if self.rate else {}


MODES = {
    "job": Mode("job", "10/s", 10.0, 10, "job", 0.01),
    "cost": Mode("cost", "1/s", 1.0, 10, "cost", 0.1),
    "none": Mode("none", "", 0.0, 0, "job", 0.01),  # the control: B's jobs alone, no rate
}


# --- the app the workers run (``celery -A rate_bench``), built from RATE_* variables ---------


def make_app(conf: dict[str, Any], prefix: str, a_seconds: float) -> Any:
    """The bench's Celery app: ``rate.a`` and ``rate.b`` sleep, and record their start and end
    under ``prefix`` in the record Redis."""
    from celery import Celery

    from celery_fair import fair_task

    app = Celery("rate_bench", set_as_current=False)
    app.conf.update(conf)
    record = redis.Redis.from_url(RECORD)

    def run(kind: str, seconds: float) -> None:
        start = time.time()
        if kind == "a":
            record.rpush(f"{prefix}:a", start)
        time.sleep(seconds)
        end = time.time()
        record.rpush(f"{prefix}:spans", f"{kind} {start!r} {end!r} {os.getppid()}")

    # No conflict group, one job id per key: each key's estimate is learned from all its jobs.
    @fair_task(app=app, name="rate.a", type="a", priority=8, default_cost=a_seconds)
    def a(seconds: float) -> None:
        run("a", seconds)

    @fair_task(app=app, name="rate.b", type="b", priority=8, default_cost=B_SECONDS)
    def b(seconds: float) -> None:
        run("b", seconds)

    return app


if "RATE_CONF" in os.environ:  # in a worker
    app = make_app(
        json.loads(os.environ["RATE_CONF"]),
        os.environ["RATE_PREFIX"],
        float(os.environ["RATE_A_SECONDS"]),
    )


# --- one run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    charged: float  # A's charges started in the window
    promise: float  # rate * window + burst
    after_burst: float  # A's charge rate after its burst, to the window's end
    max1: float  # most charges started in any 1 s
    max10: float
    starts: int  # A's starts in the window
    busy: float  # share of the fleet's slot-time used while A ran
    split: tuple[int, ...]  # A's starts in the window by worker
    lag: float  # seconds from the workers' start to A's first start


def conf_for(broker: str, queue: str, prefix: str, mode: Mode, lookahead: int | None) -> dict:
    conf: dict[str, Any] = {
        "broker_url": BROKERS[broker],
        "task_default_queue": queue,
        "task_ignore_result": True,
        "worker_prefetch_multiplier": 1,
        "broker_connection_retry_on_startup": True,
        "fair_store_prefix": prefix,
        "fair_dead_letter_queue": f"{queue}-dead",
        "fair_keys": {"A": mode.policy()} if mode.rate else {},
    }
    if broker == "redis":  # kombu's keys under the run's prefix too: cleanup is one SCAN
        conf["broker_transport_options"] = {"global_keyprefix": f"{prefix}:"}
    else:
        conf["fair_store_url"] = STORE
    if lookahead is not None:
        conf["fair_lookahead"] = lookahead
    return conf


def windowed_max(times: list[float], charges: list[float], width: float) -> float:
    """The most ``charges`` started in any ``[t, t + width]``, ``t`` one of ``times`` (sorted)."""
    sums = [0.0]
    for c in charges:
        sums.append(sums[-1] + c)
    best = 0.0
    for i, t in enumerate(times):
        j = bisect.bisect_right(times, t + width)
        best = max(best, sums[j] - sums[i])
    return best


def busy(spans: list[tuple[str, float, float, int]], begin: float, end: float, slots: int) -> float:
    """The share of ``slots`` the ``spans`` kept busy from when every worker had started a job
    (and not before ``begin``) to ``end``."""
    firsts: dict[int, float] = {}
    for _, s, _, pid in spans:
        firsts[pid] = min(s, firsts.get(pid, s))
    up = max([begin, *firsts.values()]) if len(firsts) == WORKERS else math.inf
    used = sum(max(0.0, min(e, end) - max(s, up)) for _, s, e, _ in spans)
    return used / (slots * (end - up)) if end > up else math.nan


def analyse(
    spans: list[tuple[str, float, float, int]], mode: Mode, window: float, slots: int
) -> tuple[float, Measured]:
    if not mode.rate:  # the control: only how busy B's jobs keep the fleet over the window
        t0 = min(s for _, s, _, _ in spans)
        return t0, Measured(*[math.nan] * 5, 0, busy(spans, t0, t0 + window, slots), (), 0.0)
    a_spans = sorted((s, e, pid) for kind, s, e, pid in spans if kind == "a")
    a0 = a_spans[0][0]
    inside = [(s, e, pid) for s, e, pid in a_spans if s <= a0 + window]
    times = [s for s, _, _ in inside]
    charges = [1.0 if mode.per == "job" else e - s for s, e, _ in inside]
    charged = sum(charges)
    burst_end = a0 + mode.burst / mode.per_second
    after = sum(c for t, c in zip(times, charges, strict=True) if t > burst_end)
    by_worker = dict.fromkeys({pid for *_, pid in spans}, 0)
    for _, _, pid in inside:
        by_worker[pid] += 1
    return a0, Measured(
        charged,
        mode.per_second * window + mode.burst,
        after / (a0 + window - burst_end) if window > burst_end - a0 else math.nan,
        windowed_max(times, charges, 1.0),
        windowed_max(times, charges, 10.0),
        len(inside),
        busy(spans, a0, times[-1], slots),
        tuple(sorted(by_worker.values(), reverse=True)),
        0.0,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the worker (a warm shutdown: running jobs end and record), then SIGKILL what is
    left of its process group (its id is the worker's PID: it runs in a session of its own)."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def cleanup(app: Any, broker: str, queue: str, prefix: str) -> None:
    from celery_fair.core.lanes import DEFAULT_LANES
    from celery_fair.protocol import lane_name
    from celery_fair.routing import Shards, shard_name

    urls = {RECORD, STORE} | ({BROKERS["redis"]} if broker == "redis" else set())
    for url in urls:
        with redis.Redis.from_url(url) as r:
            for pattern in (f"{prefix}:*", f"{{{prefix}}}:*"):  # kombu's and records; store's
                for key in r.scan_iter(match=pattern, count=1000):
                    r.delete(key)
    if broker == "amqp":
        names = [queue, f"{queue}-dead"]
        names += [shard_name(queue, i) for i in range(Shards.of(app).count)]
        names += [lane_name(queue, j) for j in range(DEFAULT_LANES)]
        with app.connection_for_write() as conn:
            channel = conn.default_channel
            for name in names:
                try:
                    channel.queue_delete(name)
                except Exception:  # it may not exist: the channel closes, take another
                    channel = conn.channel()
    app.close()


def measure(
    broker: str,
    mode: Mode,
    window: float,
    concurrency: int,
    code: str | None,
    lookahead: int | None,
    logs: Path,
    dump: list[dict[str, Any]] | None = None,
) -> Measured:
    run_id = uuid.uuid4().hex[:10]
    queue = prefix = f"rate-{run_id}"
    conf = conf_for(broker, queue, prefix, mode, lookahead)
    app = make_app(conf, prefix, mode.a_seconds)
    record = redis.Redis.from_url(RECORD)
    slots = WORKERS * concurrency
    n_a = math.ceil(mode.starts_per_s * window * 1.5 + mode.burst_starts) if mode.rate else 0
    n_b = math.ceil(slots * (window + 15) / B_SECONDS)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        a_task, b_task = app.tasks["rate.a"], app.tasks["rate.b"]
        sent_a = sent_b = 0
        while sent_a < n_a or sent_b < n_b:  # interleaved, in proportion
            if sent_b >= n_b or (sent_a < n_a and sent_a * n_b <= sent_b * n_a):
                a_task.apply_async([mode.a_seconds], fairness_key="A", job_id="a")
                sent_a += 1
            else:
                b_task.apply_async([B_SECONDS], fairness_key="B", job_id="b")
                sent_b += 1
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([code, str(HERE)] if code else [str(HERE)]),
            "RATE_CONF": json.dumps(conf),
            "RATE_PREFIX": prefix,
            "RATE_A_SECONDS": repr(mode.a_seconds),
        }
        started = time.time()
        for i in range(WORKERS):
            with open(logs / f"{run_id}-w{i}.log", "wb") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "celery", "-A", "rate_bench", "worker",
                         "-P", "fair", "-c", str(concurrency), "-Q", queue,
                         "-n", f"rate{i}-{run_id}@%h", "--without-mingle", "--without-gossip",
                         "-l", "WARNING"],
                        cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )  # fmt: skip
        first = None
        deadline = time.time() + 90
        while first is None or time.time() < first + window + 1.0:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a worker exited early: see {logs}/{run_id}-w*.log")
            if first is None:
                # (the control has no A: its first job's span, recorded 0.2 s after its start)
                got = record.lindex(f"{prefix}:a", 0) if mode.rate else None
                if not mode.rate and (line := record.lindex(f"{prefix}:spans", 0)):
                    got = line.split()[1]
                first = float(got) if got is not None else None
                if first is None and time.time() > deadline:
                    raise RuntimeError(f"no job of A started in 90 s: see {logs}")
            time.sleep(0.05)
        for proc in procs:
            stop(proc)
        raw = record.lrange(f"{prefix}:spans", 0, -1)
        spans = []
        for line in raw:
            kind, s, e, pid = line.decode().split()
            spans.append((kind, float(s), float(e), int(pid)))
        a0, measured = analyse(spans, mode, window, slots)
        if dump is not None:
            dump.append({"broker": broker, "mode": mode.name, "a0": a0, "spans": spans})
        return dataclasses.replace(measured, lag=a0 - started)
    finally:
        for proc in procs:
            stop(proc)
        record.close()
        cleanup(app, broker, queue, prefix)


def spread(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    if len(values) == 1:
        return format(med, fmt)
    return f"{med:{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="redis", help="redis and/or amqp")
    parser.add_argument("--modes", default="job,cost", help="job and/or cost")
    parser.add_argument("--runs", type=int, default=3, help="runs per broker and mode")
    parser.add_argument("--window", type=float, default=60.0, help="seconds from A's first start")
    parser.add_argument("--concurrency", type=int, default=2, help="slots per worker")
    parser.add_argument(
        "--lookahead", type=int, default=None, help="fair_lookahead (default: the worker's own)"
    )
    parser.add_argument(
        "--code", metavar="DIR", default=None, help="the celery_fair in DIR (a checkout's src)"
    )
    parser.add_argument("--dump", metavar="FILE", help="write every run's job spans to FILE (JSON)")
    parser.add_argument("--quick", action="store_true", help="a 5 s window, one run")
    args = parser.parse_args()
    if args.quick:
        args.window, args.runs = 5.0, 1
    code = str(Path(args.code).resolve()) if args.code else None
    if code:
        sys.path.insert(0, code)
    import celery

    import celery_fair

    with redis.Redis.from_url(RECORD) as r:
        version = r.info("server")["redis_version"]
    print(
        f"celery_fair from {Path(celery_fair.__file__).parent}, Celery {celery.__version__}, "
        f"Redis {version}; {WORKERS} workers -P fair -c {args.concurrency}, "
        f"window {args.window:g} s, {args.runs} run(s) each\n",
        flush=True,
    )
    cells = [(b, MODES[m]) for b in args.brokers.split(",") for m in args.modes.split(",")]
    got: dict[tuple[str, str], list[Measured]] = {(b, m.name): [] for b, m in cells}
    dump: list[dict[str, Any]] | None = [] if args.dump else None
    with tempfile.TemporaryDirectory(prefix="rate-bench-") as tmp:
        logs = Path(tmp)
        for i in range(args.runs):
            for broker, mode in cells if i % 2 == 0 else cells[::-1]:
                m = measure(
                    broker, mode, args.window, args.concurrency, code, args.lookahead, logs, dump
                )
                got[broker, mode.name].append(m)
                if not mode.rate:
                    print(f"run {i + 1} {broker:5} none: busy {m.busy:.3f}", flush=True)
                    continue
                print(
                    f"run {i + 1} {broker:5} {mode.name:4}: A {m.charged:.1f} of "
                    f"{m.promise:g} ({m.charged / m.promise:.3f}), {m.starts} starts, after "
                    f"burst {m.after_burst:.3f}/s, max 1 s {m.max1:.2f}, max 10 s "
                    f"{m.max10:.2f}, busy {m.busy:.3f}, split {'/'.join(map(str, m.split))}, "
                    f"first A start {m.lag:.1f} s after the workers",
                    flush=True,
                )
    if args.dump:
        Path(args.dump).write_text(json.dumps(dump))
    w = args.window
    print(
        f"\n{'broker':6} {'per':4} {'rate':5} {'burst':>5} {'A in ' + f'{w:g} s':>22} "
        f"{'promise':>7} {'A/promise':>19} {'after burst':>21} {'max 1 s':>19} "
        f"{'max 10 s':>22} {'busy':>19}"
    )
    for (broker, name), runs in got.items():
        mode = MODES[name]
        b = mode.burst
        if not mode.rate:
            print(f"{broker:6} none (B alone){'':>137}{spread([r.busy for r in runs], '.3f'):>19}")
            continue
        print(
            f"{broker:6} {name:4} {mode.rate:5} {b:>5g} "
            f"{spread([r.charged for r in runs], '.1f'):>22} {runs[0].promise:>7g} "
            f"{spread([r.charged / r.promise for r in runs], '.3f'):>19} "
            f"{spread([r.after_burst for r in runs], '.3f'):>21} "
            f"{spread([r.max1 for r in runs], '.1f'):>19} "
            f"{spread([r.max10 for r in runs], '.1f'):>22} "
            f"{spread([r.busy for r in runs], '.3f'):>19}"
        )
        print(
            f"{'':16} bounds: max 1 s <= {mode.per_second + b:g}, max 10 s <= "
            f"{mode.per_second * 10 + b:g}, after burst -> {mode.per_second:g}/s"
            + (" (seconds of work)" if mode.per == "cost" else "")
        )


if __name__ == "__main__":
    main()
