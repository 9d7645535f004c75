"""Where a long simulation's time goes: reading the trace, checking it, the core, the output.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/sim_bench.py                 # 100,000 jobs, 1,000 keys, 2,000 repositories
    python benchmarks/sim_bench.py --jobs 10000    # to check it runs
    python benchmarks/sim_bench.py --burst         # issue 35's trace, the command timed whole
    python benchmarks/sim_bench.py --burst --rules # the same with issue 34's rules configured

``--burst``: issue 35's trace instead: every job arrives at once, 90% of them on 50 job ids of
one conflict group (the rest on ids of their own), over ``--keys`` keys, capacity 32; and the
whole ``celery-fair simulate TRACE`` command is timed too (process start, reading, output to a
file), median of ``--runs``.

``--rules`` (with ``--burst``): issue 34's rules configured as well, none of them binding, to
see what their bookkeeping costs: two-level keys (each key ``t<n>/k<m>`` in one of 100
tenants, ``key_separator`` ``/``), a rate on every key and on every tenant, and one on each type,
each far above what the trace can start.

It writes a seeded trace (three job types over one conflict group, Poisson arrivals at eight
jobs a second, 0.1 to 1.5 s each, eight slots), then times each phase of ``celery-fair
simulate`` in one process, median of ``--runs``.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from celery_fair.sim import parse_trace, simulate


def make_trace(jobs: int, keys: int, repos: int, seed: int = 7) -> dict[str, object]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(jobs):
        t += rng.expovariate(8.0)
        out.append({
            "name": f"j{i}", "type": rng.choice(["clone", "fetch", "repack"]),
            "job_id": f"repo{rng.randrange(repos)}", "fairness_key": f"k{rng.randrange(keys)}",
            "arrival": round(t, 4), "duration": round(rng.uniform(0.1, 1.5), 4),
        })  # fmt: skip
    types = {
        "clone": {"priority": 8, "max_concurrency": 6, "conflict_group": "git", "default_cost": 1},
        "fetch": {"priority": 8, "conflict_group": "git", "default_cost": 0.5},
        "repack": {"priority": 4, "max_concurrency": 2, "conflict_group": "git", "default_cost": 2},
    }
    return {"capacity": 8, "types": types, "jobs": out}


def make_burst(jobs: int, keys: int, seed: int = 7, rules: bool = False) -> dict[str, object]:
    """Issue 35's trace: all at once, 90% on 50 conflicting ids, capacity 32; with ``rules``,
    issue 34's rules too (the module's doc)."""
    rng = random.Random(seed)
    out = []
    for i in range(jobs):
        hot = rng.random() < 0.9
        out.append({
            "name": f"j{i}", "type": rng.choice(["clone", "fetch", "repack"]),
            "job_id": f"repo{rng.randrange(50)}" if hot else f"own{i}",
            "fairness_key": f"k{rng.randrange(keys)}",
            "arrival": 0.0, "duration": round(rng.uniform(0.1, 1.5), 4),
        })  # fmt: skip
    trace = make_trace(0, keys, 1, seed)
    if not rules:
        return {**trace, "capacity": 32, "jobs": out}
    for job in out:  # k<m> becomes t<m % 100>/k<m>: 100 tenants of about ten keys each
        key = job["fairness_key"]
        job["fairness_key"] = f"t{int(key[1:]) % 100}/{key}"
    types = {name: {**spec, "rate": 1e6, "burst": 1e6} for name, spec in trace["types"].items()}
    never = {"rate": "1000000/s", "burst": 1000000}
    return {
        **trace, "capacity": 32, "jobs": out, "types": types, "key_separator": "/",
        "keys": {"t*/*": never, "t*": never},
    }  # fmt: skip


def time_command(text: str, runs: int) -> float:
    """Median seconds of ``celery-fair simulate`` on ``text`` as a file, output to a file."""
    with tempfile.TemporaryDirectory() as tmp:
        trace, out = Path(tmp) / "trace.json", Path(tmp) / "out.json"
        trace.write_text(text)
        took = []
        for _ in range(runs):
            t0 = time.perf_counter()
            with out.open("w") as sink:
                subprocess.run(
                    [sys.executable, "-m", "celery_fair", "simulate", str(trace)],
                    stdout=sink,
                    check=True,
                )
            took.append(time.perf_counter() - t0)
        return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--repos", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--burst", action="store_true", help="issue 35's trace (module doc)")
    parser.add_argument("--rules", action="store_true", help="with --burst: issue 34's rules too")
    args = parser.parse_args()
    if args.burst:
        text = json.dumps(make_burst(args.jobs, args.keys, rules=args.rules))
        whole = time_command(text, args.runs)
        rate = args.jobs / whole
        print(f"celery-fair simulate, the whole command: {whole:.2f} s, {rate:,.0f} jobs/s")
    else:
        text = json.dumps(make_trace(args.jobs, args.keys, args.repos))
    phases: dict[str, list[float]] = {}
    for _ in range(args.runs):
        t0 = time.perf_counter()
        data = json.loads(text)
        t1 = time.perf_counter()
        trace = parse_trace(data)
        t2 = time.perf_counter()
        result = simulate(trace)
        t3 = time.perf_counter()
        result.write_json(io.StringIO())
        t4 = time.perf_counter()
        json.dump(result.to_json(), io.StringIO(), indent=1)  # the output before write_json
        t5 = time.perf_counter()
        for name, took in (("read JSON", t1 - t0), ("check the trace", t2 - t1),
                           ("simulate (core + summary)", t3 - t2), ("write JSON", t4 - t3),
                           ("(write JSON indented, before)", t5 - t4)):  # fmt: skip
            phases.setdefault(name, []).append(took)
    print(f"{args.jobs} jobs, {args.keys} keys, {args.repos} repositories; median of {args.runs}")
    for name, took in phases.items():
        print(f"{name:32} {statistics.median(took):7.2f} s")
    core = statistics.median(phases["simulate (core + summary)"])
    print(f"{'jobs per second (simulate)':32} {args.jobs / core:9,.0f}")


if __name__ == "__main__":
    main()
