"""CPU per job of plain Celery and of ``-P fair`` (8 shards) over one burst: each process's.

Run by hand (results go to docs/benchmarks.md with the command):

    python benchmarks/cpu_per_job.py 2000 2        # a burst of 2,000, 2 rounds, 3 workers x 2

Starts the workers as burst_bench.py does (same app), publishes a burst of 20 ms jobs of one
key, waits for every end, and reads the CPU time (user + system, from ``/proc``) that the
workers' main processes, their pool processes and the Redis server spent meanwhile, per job,
with the burst's wall time. The order of the variants alternates from round to round.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import burst_bench as bb


def cpu_of(pid: int) -> float:
    """Seconds of CPU ``pid`` has used (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def run(variant: str, topology: str, size: int) -> str:
    queue = f"burst-{uuid.uuid4().hex[:8]}"
    key = f"burst:{queue}"
    shards = 1 if variant == "plain" else 8
    module = bb.app_for(bb.BROKERS["redis"], queue, key, shards)
    record = redis.Redis.from_url(bb.RECORD)
    env = {**os.environ, "PYTHONPATH": str(bb.HERE), "BURST_SHARDS": str(shards)}
    procs = bb.start_workers(variant, topology, env, queue)
    try:
        deadline = time.time() + 60
        while len(module.app.control.ping(timeout=0.5) or []) < len(procs):
            if time.time() > deadline:
                raise RuntimeError(f"{variant} workers did not start")
        mains = [p.pid for p in procs]
        pool = [c for pid in mains for c in children(pid)]
        server = int(redis.Redis().info("server")["process_id"])
        before = [cpu_of(p) for p in (*mains, *pool, server)]
        began = time.time()
        for _ in range(size):
            module.job.apply_async(["A", bb.SECONDS], fairness_key="A")
        while record.zcard(f"{key}:end:A") < size:
            time.sleep(0.05)
        wall = time.time() - began
        after = [cpu_of(p) for p in (*mains, *pool, server)]
        used = [b - a for a, b in zip(before, after, strict=True)]
        main = sum(used[: len(mains)]) * 1000 / size
        in_pool = sum(used[len(mains) : -1]) * 1000 / size
        return (
            f"{variant:8} {topology}  wall {wall:6.2f} s  main {main:.2f} ms/job  "
            f"pool {in_pool:.2f} ms/job  redis {used[-1] * 1000 / size:.2f} ms/job"
        )
    finally:
        for proc in procs:
            os.kill(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(60)
        record.delete(f"{key}:start:A", f"{key}:end:A")
        module.app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("size", type=int, nargs="?", default=2000)
    parser.add_argument("rounds", type=int, nargs="?", default=2)
    parser.add_argument("--topology", default="3x2")
    args = parser.parse_args()
    for r in range(args.rounds):
        for variant in ("plain", "fair/8") if r % 2 == 0 else ("fair/8", "plain"):
            print(run(variant, args.topology, args.size), flush=True)


if __name__ == "__main__":
    main()
