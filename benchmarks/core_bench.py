"""Admit+complete throughput of the scheduling core as pending and blocked jobs pile up.

Run by hand (results and the command go to docs/benchmarks.md):

    python benchmarks/core_bench.py                 # the full table (a few minutes)
    python benchmarks/core_bench.py --quick         # small sizes, to check it runs

Each row pre-fills the scheduler with N pending jobs, fills every slot, then measures a steady
cycle: complete the oldest running job, admit the next job, submit one replacement so N stays
constant. "pairs/s" counts only the complete and admit calls (each timed); "cycles/s" the whole
cycle with the submit. Every measurement runs in a fresh process (so one case's million-object
heap does not tax the next through the garbage collector), the cases interleaved round by
round, and each row is the median of the rounds.

Blocked rows: 100 hot conflict ids are held by long-running jobs and 90% of pending jobs wait
on them. "churn" rows release and re-take the hot ids all the time, so loans move; "N ids/key"
is how many distinct hot ids one client's jobs wait on.

Two-level rows ("S/0..S/K-1 + T0..T3"): tenant S spreads 90% of the pending jobs over K keys
S/0..S/K-1 (100 or 10,000), and four tenants T0..T3 have one key each (2.5% each); each
replacement goes to the admitted job's tenant (S: one of its keys at random), so every tenant
keeps its share of N. "two-level" runs them with ``key_separator="/"`` (tenants served fairly
first, then the keys of the chosen tenant); "flat" runs the same jobs without it (K + 4 keys),
the row to compare it with.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery_fair.core import CostLifecycle, JobType, Scheduler, SchedulerConfig, SimClock

SLOTS = 64
HOT_IDS = 100
TENANT_SHARE = 0.9  # two-level rows: tenant S's share of the pending jobs


@dataclass(frozen=True)
class Case:
    label: str
    pending: int
    keys: int
    blocked: float = 0.0  # share of pending jobs on hot conflict ids
    churn: bool = False  # hot conflicts are released and taken again (loans move)
    spread: int = HOT_IDS  # how many distinct hot ids one key's jobs wait on
    tenant_keys: int = 0  # keys of tenant S beside `keys` one-key tenants (0: clients, flat)
    two_level: bool = False  # key_separator="/": S/0.. are one tenant's keys


class Workload:
    """Deterministic job stream for one case."""

    def __init__(self, case: Case, seed: int = 7) -> None:
        self.case = case
        self.rng = random.Random(seed)
        self.n = 0

    def next_job(self, hot: bool | None = None, like: str | None = None) -> tuple[int, str, str]:
        """A new job; on a hot id with probability ``blocked`` unless ``hot`` says. In the
        two-level rows, of the tenant of key ``like`` (the admitted job's), if given."""
        self.n += 1
        if self.case.tenant_keys:
            return self.n, f"repo-{self.n}", self.tenant_key(like)
        key = f"client-{self.rng.randrange(self.case.keys)}"
        if hot is None:
            hot = self.rng.random() < self.case.blocked
        if hot:
            # Key i waits on `spread` hot ids of its own choosing.
            k = int(key.rsplit("-", 1)[1])
            job_id = f"hot-{(k * 7 + self.rng.randrange(self.case.spread)) % HOT_IDS}"
        else:
            job_id = f"repo-{self.n}"
        return self.n, job_id, key

    def tenant_key(self, like: str | None) -> str:
        """A key of tenant S (``TENANT_SHARE``) or of one of the one-key tenants T0.., or of
        ``like``'s tenant if given."""
        rng = self.rng
        if like is not None:
            tenant = like.partition("/")[0]
        elif rng.random() < TENANT_SHARE:
            tenant = "S"
        else:
            tenant = f"T{rng.randrange(self.case.keys)}"
        return f"S/{rng.randrange(self.case.tenant_keys)}" if tenant == "S" else tenant


def build(case: Case) -> tuple[Scheduler, Workload, deque[int]]:
    clock = SimClock()
    types = [JobType("clone", priority=SLOTS + HOT_IDS, conflict_group="git")]
    if case.two_level:  # (the flat rows name no separator: they run --against older code too)
        config = SchedulerConfig(
            SLOTS + HOT_IDS, lifecycle=CostLifecycle.never(), key_separator="/"
        )
    else:
        config = SchedulerConfig(SLOTS + HOT_IDS, lifecycle=CostLifecycle.never())
    scheduler = Scheduler(config, clock, types)
    work = Workload(case)
    if case.blocked:
        # One long-running holder per hot id; they hold their conflicts for the whole run
        # (unless churn), so hot jobs are parked as they reach the front.
        for i in range(HOT_IDS):
            scheduler.submit(("holder", i), "clone", f"hot-{i}", "holders", cost=0)
        scheduler.schedule()
    for _ in range(case.pending):
        ref, job_id, key = work.next_job()
        scheduler.submit(ref, "clone", job_id, key, cost=1.0)
    running = deque(_uid(a) for a in scheduler.schedule())  # type: ignore[misc]
    while scheduler.pending < case.pending:  # top up what filling the slots took
        ref, job_id, key = work.next_job(hot=False)
        scheduler.submit(ref, "clone", job_id, key, cost=1.0)
    if case.churn:
        running.extend(("holder", i) for i in range(HOT_IDS))  # type: ignore[misc]
    return scheduler, work, running


def measure(case: Case, cycles: int, collect: bool = True) -> tuple[float, float]:
    """Seconds per admit+complete pair and per cycle (pair + submit).

    With ``collect`` (the default, as in production) CPython's garbage collector runs as it
    will; its full passes cost time in proportion to every live object in the process, so the
    window must be long enough to include them. Without it the collector is paused for the
    measured window only, which isolates the cost of the scheduler's own structures.

    The replacement is of the same kind (hot id or not) as the job admitted, so the share of
    blocked jobs stays what the case says.
    """
    scheduler, work, running = build(case)
    submit = scheduler.submit
    complete = scheduler.complete
    admit = scheduler.next_admission
    next_job = work.next_job
    clock = time.perf_counter
    in_pairs = 0.0
    if not collect:
        gc.disable()
    start = clock()
    for _ in range(cycles):
        t0 = clock()
        complete(running.popleft(), 1.0)
        admission = admit()
        in_pairs += clock() - t0
        assert admission is not None, "every cycle must admit a job"
        running.append(_uid(admission))  # type: ignore[arg-type]
        hot = admission.job_id.startswith("hot")  # type: ignore[union-attr]
        ref, job_id, key = next_job(hot, admission.fairness_key)
        submit(ref, "clone", job_id, key, cost=1.0)
    elapsed = clock() - start
    gc.enable()
    assert scheduler.pending >= case.pending - 1, "the workload must keep N pending"
    return in_pairs / cycles, elapsed / cycles


def bytes_per_pending_job(n: int = 100_000) -> float:
    """Memory the core holds per pending job, with 36-character task ids as references."""
    scheduler = Scheduler(
        SchedulerConfig(8, lifecycle=CostLifecycle.never()),
        SimClock(),
        [JobType("clone", priority=8, conflict_group="git")],
    )
    refs = [str(uuid.UUID(int=i)) for i in range(n)]
    keys = [f"client-{i % 1000}" for i in range(n)]
    job_ids = [f"repo-{i}" for i in range(n)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(n):
        scheduler.submit(refs[i], "clone", job_ids[i], keys[i])
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    return grown / n


def _uid(admission: Any) -> Any:
    """An admission's job (``ref`` before the core named it ``uid``, for ``--against``)."""
    return admission.uid if hasattr(admission, "uid") else admission.ref


def cases(quick: bool) -> list[Case]:
    if quick:
        return [
            Case("quick", 1_000, 10),
            Case("quick blocked", 1_000, 10, blocked=0.9),
            Case("quick churn", 1_000, 10, blocked=0.9, churn=True, spread=3),
            Case("quick two-level", 1_000, 4, tenant_keys=100, two_level=True),
        ]
    out = [Case(f"N={n:,} keys=1k", n, 1_000) for n in (1_000, 10_000, 100_000, 1_000_000)]
    out += [Case(f"N=100,000 keys={k:,}", 100_000, k) for k in (10, 100_000)]
    out += [
        Case(f"N={n:,} keys=1k 90% blocked", n, 1_000, blocked=0.9)
        for n in (1_000, 100_000, 1_000_000)
    ]
    out += [
        Case(f"N={n:,} keys=1k 90% hot, churn, 3 ids/key", n, 1_000, 0.9, churn=True, spread=3)
        for n in (1_000, 100_000, 1_000_000)
    ]
    out += [Case("N=100,000 keys=1k 90% hot, churn, 100 ids/key", 100_000, 1_000, 0.9, True)]
    out += [
        Case(f"N=100,000 S/0..S/{k - 1} + T0..T3, {mode}", 100_000, 4, tenant_keys=k, two_level=two)
        for k in (100, 10_000)
        for mode, two in (("flat", False), ("two-level", True))
    ]
    return out


def run_isolated(
    index: int, quick: bool, cycles: int, gc_mode: str, code: str | None = None
) -> tuple[float, float]:
    """Measure case ``index`` in a fresh interpreter (``code``: with ``celery_fair`` from the
    ``src`` folder of another checkout)."""
    command = [sys.executable, __file__, "--one", str(index), "--cycles", str(cycles)]
    command += ["--gc", gc_mode]
    if quick:
        command.append("--quick")
    env = {**os.environ, "PYTHONPATH": code} if code else None
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env).stdout
    pair, cycle = json.loads(out)
    return pair, cycle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, to check it runs")
    parser.add_argument(
        "--cycles",
        type=int,
        default=200_000,
        help="measured cycles per run (long enough "
        "to include the collector's full passes at a million jobs)",
    )
    parser.add_argument(
        "--gc",
        choices=("on", "off"),
        default="on",
        help="off: pause the garbage collector during the measured window only",
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds (median kept)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # internal: one case
    parser.add_argument(
        "--cases", default="", help="only the cases whose label contains this, e.g. 'blocked'"
    )
    parser.add_argument(
        "--against",
        default=None,
        help="the src folder of another checkout: each case runs with it too, in the same rounds",
    )
    args = parser.parse_args()
    todo = cases(args.quick)
    cycles = 500 if args.quick else args.cycles
    if args.one is not None:
        print(json.dumps(measure(todo[args.one], cycles, collect=args.gc == "on")))
        return
    chosen = [(i, c) for i, c in enumerate(todo) if args.cases in c.label]
    against = str(Path(args.against).resolve()) if args.against else None
    versions: list[str | None] = [None, against] if against else [None]
    samples: dict[tuple[str, str | None], list[tuple[float, float]]] = {
        (c.label, v): [] for _, c in chosen for v in versions
    }
    for r in range(args.repeat):  # interleaved: every case once per round, versions alternating
        for i, case in chosen:
            for v in versions if r % 2 == 0 else versions[::-1]:
                samples[case.label, v].append(run_isolated(i, args.quick, cycles, args.gc, v))
    print(f"garbage collector {args.gc}, {cycles:,} cycles per run, median of {args.repeat}")
    print(f"{'case':55} {'pairs/s':>9} {'us/pair':>8} {'cycles/s':>9} {'us/cycle':>9}")
    for _, case in chosen:
        for v in versions:
            pair = statistics.median(p for p, _ in samples[case.label, v])
            cycle = statistics.median(c for _, c in samples[case.label, v])
            label = case.label if v is None else f"{case.label} @base"
            print(
                f"{label:55} {1 / pair:>9,.0f} {pair * 1e6:>8.2f} {1 / cycle:>9,.0f} "
                f"{cycle * 1e6:>9.2f}"
            )
    n = 10_000 if args.quick else 100_000
    print(f"\nmemory per pending job (N={n:,}, 36-char task ids): {bytes_per_pending_job(n):.0f} B")


if __name__ == "__main__":
    main()
