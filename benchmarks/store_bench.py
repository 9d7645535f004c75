"""Store throughput: admit+finish pairs per second on Redis from 1, 4 and 8 processes.

Run by hand against the Redis on 127.0.0.1:6379; results go to docs/benchmarks.md with the
command:

    python benchmarks/store_bench.py                        # 1, 4, 8 processes, 3000 cycles each
    python benchmarks/store_bench.py --quick                # small sizes, to check it runs
    python benchmarks/store_bench.py --procs 1,2 --cycles 5000 --rounds 5
    python benchmarks/store_bench.py --rates --rounds 7     # rate terms that never limit, or none

One cycle is one ``admit`` call then one ``finish`` call of the jobs it admitted (with an
elapsed time, so the estimate is learned). With ``batch 1`` a cycle asks for one job; with
``batch 8`` it asks for eight in one call and finishes them in one call. ``calls 1`` is how a
worker really talks to the store: each ``admit`` also carries the finishes of the jobs the
previous one admitted, so a pair costs one round trip instead of two. Every client process
has its own connection and worker name; all start together (a barrier, after a warm-up that
loads the scripts), and the rate is the aggregate over the span from the first start to the
last end. Three job types with caps far above what can run at once, four fairness keys and
10,000 job ids per conflict group, so nearly every job is admitted and conflicts are rare.

Each measurement runs in fresh processes on a fresh random prefix, removed with SCAN afterwards
(never FLUSHALL: the Redis is shared). Cases are interleaved round by round and each row is the
median of the rounds. ``MemoryStore`` runs the same cycles in one process, for scale.

Round trips are counted by the server: ``INFO commandstats`` (EVALSHA and EVAL calls) read
before and after a single-process run of admits, then of finishes, divided by the calls made.
CONFIG RESETSTAT is not used (the server is shared), so other clients' scripts are counted too:
a window as long with nothing of ours running measures their share, which is taken out (the
median of five runs is shown, with both raw figures). The same counters give the server's own
time per script call, and ``cpu us/pair`` is a client process's CPU time per pair: together
with ``us/pair`` they show whether the server, the clients or the wire sets the pace.

``--rates`` measures instead what a rate limit by fairness key costs an admission that it does
not refuse: the same cycles (the same seeds) with every ask carrying rate terms too high ever to
limit (``RATE`` per second, a bucket of ``RATE``; charged per job, or per cost) and without
any, the cases interleaved round by round (the order reversed every other round). Each row is
the median over rounds of the ratio with rate terms to without, in the same round, with the
spread; and, from ``INFO commandstats`` as above, the server's time per admit script call with
and without them (median of 5 runs each, others' share taken out).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import queue
import random
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from celery_fair.core import CostLifecycle
from celery_fair.store import (
    Ask,
    Done,
    MemoryStore,
    RedisStore,
    Verdict,
    conflict_field,
    estimate_field,
)

URL = "redis://127.0.0.1:6379/0"
TYPES = (("clone", 8, "git"), ("pull", 8, "git"), ("repack", 4, ""))  # name, priority, group
CAP = 10_000  # tier and type caps: far above what runs at once (processes x batch)
KEYS = ("alice", "bob", "carol", "dave")
IDS = 10_000  # job ids per group: two running jobs rarely share one, so conflicts are rare
ELAPSED = 0.05
WARMUP = 50  # cycles before the barrier: connection open, scripts loaded
SCRIPT_CALLS = ("cmdstat_evalsha", "cmdstat_eval")
RATE = 1e6  # --rates: a rate per second and a bucket no cycle of this bench ever empties


@dataclass(frozen=True)
class Case:
    store: str  # "redis" or "memory"
    procs: int
    batch: int
    combined: bool = False  # finishes ride on the next admit: one call per pair
    rate: str | None = None  # --rates: each ask carries rate terms, charged per "job" or "cost"


@dataclass(frozen=True)
class Result:
    pairs_per_s: float  # admit+finish call pairs per second, all processes together
    jobs_per_s: float  # jobs admitted and finished per second, all processes together
    us_per_pair: float  # one process's time per pair (median over processes)
    cpu_per_pair: float  # one process's own CPU time per pair, in us (median over processes)
    admitted: float  # share of asked jobs admitted


def make_cycles(
    worker: str, seed: int, cycles: int, batch: int, rate: str | None = None
) -> list[list[Ask]]:
    """The asks of every cycle, built before timing starts (``rate``: with rate terms that
    never limit, charged per "job" or "cost"; the same draws either way)."""
    terms = {} if rate is None else {"rate": RATE, "burst": RATE, "per_cost": rate == "cost"}
    rng = random.Random(seed)
    out = []
    for i in range(cycles):
        asks = []
        for j in range(batch):
            name, priority, group = rng.choice(TYPES)
            job_id = f"repo-{rng.randrange(IDS)}"
            asks.append(
                Ask(f"{worker}-{i}-{j}", name, priority, CAP, CAP,
                    conflict_field(group, job_id), estimate_field(name, job_id),
                    rng.choice(KEYS), None, 1.0, **terms)
            )  # fmt: skip
        out.append(asks)
    return out


def run_cycles(store: Any, worker: str, cycles: list[list[Ask]], combined: bool = False) -> int:
    """Admit each cycle's asks, finish what was admitted; return how many jobs ran.

    ``combined``: the finishes go with the next cycle's admit (the last ones on their own).
    """
    admitted = 0
    done: list[Done] = []
    for asks in cycles:
        reply = store.admit(worker, asks, done=done) if combined else store.admit(worker, asks)
        done = [
            Done(g.uid, g.token, ELAPSED) for g in reply.grants if g.verdict is Verdict.ADMITTED
        ]
        if not combined:
            store.finish(worker, done)
        admitted += len(done)
    if combined and done:
        store.finish(worker, done)
    return admitted


def open_store(kind: str, url: str, prefix: str) -> Any:
    if kind == "memory":
        return MemoryStore(lifecycle=CostLifecycle())
    return RedisStore(redis.Redis.from_url(url), prefix, lifecycle=CostLifecycle())


def client(
    kind: str,
    url: str,
    prefix: str,
    index: int,
    cycles: int,
    batch: int,
    combined: bool,
    barrier: Any,
    results: Any,
    rate: str | None = None,
) -> None:
    """One client process: warm up, wait for the others, run, report what it measured."""
    worker = f"bench-{index}"
    store = open_store(kind, url, prefix)
    run_cycles(store, worker, make_cycles(f"{worker}-warm", index + 1000, WARMUP, batch, rate))
    work = make_cycles(worker, index, cycles, batch, rate)
    barrier.wait(timeout=120)
    start, cpu = time.monotonic(), time.process_time()  # monotonic: one clock for all processes
    admitted = run_cycles(store, worker, work, combined)
    end, cpu = time.monotonic(), time.process_time() - cpu
    store.close()
    results.put((start, end, cpu, admitted))


def clean(url: str, prefix: str) -> None:
    with redis.Redis.from_url(url) as r:
        for key in r.scan_iter(match=f"{{{prefix}}}:*", count=1000):
            r.delete(key)


def measure(case: Case, cycles: int, url: str) -> Result:
    """One measurement, in ``case.procs`` fresh processes on a fresh prefix."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(case.procs)
    results = ctx.Queue()
    prefix = f"bench-store-{uuid.uuid4().hex[:10]}"
    procs = [
        ctx.Process(
            target=client,
            args=(
                case.store,
                url,
                prefix,
                i,
                cycles,
                case.batch,
                case.combined,
                barrier,
                results,
                case.rate,
            ),
        )
        for i in range(case.procs)
    ]
    try:
        for proc in procs:
            proc.start()
        got = []
        while len(got) < case.procs:
            try:
                got.append(results.get(timeout=1))
            except queue.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"a client process of {case} failed") from None
        for proc in procs:
            proc.join(60)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
        if case.store == "redis":
            clean(url, prefix)
    span = max(end for _, end, _, _ in got) - min(start for start, _, _, _ in got)
    admitted = sum(n for *_, n in got)
    return Result(
        case.procs * cycles / span,
        admitted / span,
        statistics.median((end - start) / cycles * 1e6 for start, end, _, _ in got),
        statistics.median(cpu / cycles * 1e6 for _, _, cpu, _ in got),
        admitted / (case.procs * cycles * case.batch),
    )


def script_calls(r: redis.Redis) -> tuple[int, int]:
    """EVALSHA+EVAL calls the server has counted, and the microseconds it spent in them."""
    stats = r.info("commandstats")
    return (
        sum(stats.get(name, {}).get("calls", 0) for name in SCRIPT_CALLS),
        sum(stats.get(name, {}).get("usec", 0) for name in SCRIPT_CALLS),
    )


@dataclass(frozen=True)
class Count:
    """Script calls the server counted while one kind of store call ran, per store call."""

    counted: float  # everyone's, while ours ran
    others: float  # everyone's, in a window as long with nothing of ours running
    server_us: float  # the server's time per script call of ours (others' share taken out)

    @property
    def ours(self) -> float:
        return self.counted - self.others


def count(r: redis.Redis, action: Callable[[], object], calls: int) -> Count:
    before = script_calls(r)
    start = time.monotonic()
    action()
    window = time.monotonic() - start
    after = script_calls(r)
    time.sleep(window)  # the same window again, without us: what other clients ran meanwhile
    idle = script_calls(r)
    ours = (after[0] - before[0]) - (idle[0] - after[0])
    ours_us = (after[1] - before[1]) - (idle[1] - after[1])
    return Count(
        (after[0] - before[0]) / calls,
        (idle[0] - after[0]) / calls,
        ours_us / ours if ours > 0 else float("nan"),
    )


def round_trips(url: str, calls: int, batch: int, rate: str | None = None) -> tuple[Count, Count]:
    """What the server counted for ``calls`` admit calls, then as many finish calls."""
    prefix = f"bench-store-{uuid.uuid4().hex[:10]}"
    r = redis.Redis.from_url(url)
    store = RedisStore(redis.Redis.from_url(url), prefix, lifecycle=CostLifecycle())
    cycles = make_cycles("rt", 2, calls, batch, rate)
    replies: list[Any] = []

    def admit() -> None:
        replies.extend(store.admit("rt", asks) for asks in cycles)

    def finish() -> None:
        for reply in replies:
            admitted = (g for g in reply.grants if g.verdict is Verdict.ADMITTED)
            store.finish("rt", [Done(g.uid, g.token, ELAPSED) for g in admitted])

    try:
        run_cycles(store, "rt", make_cycles("rt-warm", 1, 10, batch, rate))  # scripts loaded
        return count(r, admit, calls), count(r, finish, calls)
    finally:
        store.close()
        r.close()
        clean(url, prefix)


def median_count(counts: list[Count]) -> Count:
    return Count(
        statistics.median(c.counted for c in counts),
        statistics.median(c.others for c in counts),
        statistics.median(c.server_us for c in counts),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=3000, help="cycles per process")
    parser.add_argument("--procs", default="1,4,8", help="client processes, comma-separated")
    parser.add_argument("--batch", type=int, default=8, help="jobs per call, batched rows")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", default=URL)
    parser.add_argument("--quick", action="store_true", help="few cycles, one round")
    parser.add_argument(
        "--rates", action="store_true", help="only: rate terms that never limit against none"
    )
    args = parser.parse_args()
    cycles, rounds = (200, 1) if args.quick else (args.cycles, args.rounds)
    if args.rates:
        rates(args.url, cycles, rounds, args.batch)
        return
    procs = [int(p) for p in args.procs.split(",")]
    cases = [Case("redis", n, b) for b in (1, args.batch) for n in procs]
    cases += [Case("redis", n, 1, combined=True) for n in procs]
    cases += [Case("memory", 1, 1), Case("memory", 1, args.batch)]

    with redis.Redis.from_url(args.url) as r:
        version = r.info("server")["redis_version"]
    print(
        f"Redis {version} at {args.url}, Python {platform.python_version()}, "
        f"{cycles} cycles per process, median of {rounds} round(s)\n",
        flush=True,
    )
    measured: dict[Case, list[Result]] = {case: [] for case in cases}
    for i in range(rounds):
        for case in cases if i % 2 == 0 else cases[::-1]:
            measured[case].append(measure(case, cycles, args.url))

    print(f"{'store':6} {'procs':>5} {'batch':>5} {'calls':>5} {'pairs/s':>9} {'jobs/s':>9} "
          f"{'us/pair':>8} {'cpu us/pair':>11} {'admitted':>8}")  # fmt: skip
    for case, got in measured.items():
        print(
            f"{case.store:6} {case.procs:>5} {case.batch:>5} {1 if case.combined else 2:>5} "
            f"{statistics.median(r.pairs_per_s for r in got):>9,.0f} "
            f"{statistics.median(r.jobs_per_s for r in got):>9,.0f} "
            f"{statistics.median(r.us_per_pair for r in got):>8.1f} "
            f"{statistics.median(r.cpu_per_pair for r in got):>11.1f} "
            f"{statistics.median(r.admitted for r in got):>8.1%}"
        )

    calls = min(cycles, 500)
    print(
        f"\nround trips: EVALSHA+EVAL calls per store call, from INFO commandstats over {calls} "
        "calls, less what\nother clients ran in an equal window without us (median of 5 runs); "
        "server time per script call"
    )
    for batch in (1, args.batch):
        runs = [round_trips(args.url, calls, batch) for _ in range(5)]
        for name, counts in (("admit", [a for a, _ in runs]), ("finish", [f for _, f in runs])):
            c = median_count(counts)
            print(
                f"batch {batch:>2} {name:6}: {c.ours:.2f} per call, {c.ours / batch:.3f} per job "
                f"(counted {c.counted:.2f}, others {c.others:.2f}), "
                f"server {c.server_us:.0f} us/script"
            )


def rates(url: str, cycles: int, rounds: int, batch: int) -> None:
    """``--rates``: the same cycles with rate terms that never limit and without, interleaved."""
    shapes = [(1, 1, False), (1, 1, True), (1, batch, False), (4, 1, True)]
    kinds: list[str | None] = [None, "job", "cost"]
    cases = [Case("redis", n, b, combined, rate) for n, b, combined in shapes for rate in kinds]
    with redis.Redis.from_url(url) as r:
        version = r.info("server")["redis_version"]
    print(
        f"Redis {version} at {url}, Python {platform.python_version()}, {cycles} cycles per "
        f"process, rate terms {RATE:g}/s with a bucket of {RATE:g} (never limiting) against "
        f"none,\nmedian of {rounds} round(s) (min-max); ratio: with / without, in the same "
        "round\n",
        flush=True,
    )
    measured: dict[Case, list[Result]] = {case: [] for case in cases}
    for i in range(rounds):
        for case in cases if i % 2 == 0 else cases[::-1]:
            measured[case].append(measure(case, cycles, url))

    def spread(values: list[float], fmt: str) -> str:
        return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"

    print(
        f"{'procs':>5} {'batch':>5} {'calls':>5} {'per':>4} {'us/pair':>8} {'without':>8} "
        f"{'ratio (spread)':>20} {'cpu us/pair':>11} {'without':>8} {'cpu ratio':>20} "
        f"{'admitted':>8} {'without':>8}"
    )
    for n, b, combined in shapes:
        off = measured[Case("redis", n, b, combined)]
        for kind in kinds[1:]:
            on = measured[Case("redis", n, b, combined, kind)]
            ratios = [x.us_per_pair / y.us_per_pair for x, y in zip(on, off, strict=True)]
            cpu = [x.cpu_per_pair / y.cpu_per_pair for x, y in zip(on, off, strict=True)]
            print(
                f"{n:>5} {b:>5} {1 if combined else 2:>5} {kind:>4} "
                f"{statistics.median(x.us_per_pair for x in on):>8.1f} "
                f"{statistics.median(x.us_per_pair for x in off):>8.1f} "
                f"{spread(ratios, '.3f'):>20} "
                f"{statistics.median(x.cpu_per_pair for x in on):>11.1f} "
                f"{statistics.median(x.cpu_per_pair for x in off):>8.1f} "
                f"{spread(cpu, '.3f'):>20} "
                f"{statistics.median(x.admitted for x in on):>8.1%} "
                f"{statistics.median(x.admitted for x in off):>8.1%}"
            )

    calls = min(cycles, 500)
    print(
        f"\nserver time per admit script call (batch 1, {calls} calls, INFO commandstats, "
        "others' share taken out), median of 5 runs each, interleaved"
    )
    server: dict[str | None, list[float]] = {kind: [] for kind in kinds}
    for i in range(5):
        for kind in kinds if i % 2 == 0 else kinds[::-1]:
            admit, _ = round_trips(url, calls, 1, kind)
            server[kind].append(admit.server_us)
    for kind in kinds:
        print(f"{kind or 'none':>4}: {spread(server[kind], '.1f')} us/script")


if __name__ == "__main__":
    main()
