"""Where a long simulation's time goes: reading the trace, checking it, the core, the output.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/sim_bench.py                 # 100,000 jobs, 1,000 keys, 2,000 repositories
    python benchmarks/sim_bench.py --jobs 10000    # to check it runs

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
import time

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--repos", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
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
