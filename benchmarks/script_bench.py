"""Server time of the worker's usual store call, and of two script versions against each other.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/script_bench.py                        # this checkout's scripts
    python benchmarks/script_bench.py --against /tmp/old-lua # another version, interleaved
    python benchmarks/script_bench.py --batch 4              # four ends and four admissions
    python benchmarks/script_bench.py --terms tenant --vs-terms tenant-rate  # what a term costs

The call replayed is the one a busy worker makes most: ``admit`` reporting finished jobs and
admitting as many more (one fairness key of 10, one conflict id of 50, the default lifecycle):
one of each with two jobs running, or with ``--batch K`` K of each with 2K running (a worker
with a deep reserve reports and admits about four per call). Redis's own accounting
(``INFO commandstats``) gives the server time per ``EVALSHA`` and per command the scripts run
inside it. Redis must be otherwise idle.

``--against DIR`` loads ``common.lua``, ``admit.lua``... from DIR (for example the package's
``lua`` folder at an older commit: ``git archive <commit> src/celery_fair/store/lua``) and
alternates batches of 100 calls between the two versions, each on its own prefix: on a noisy
host the ratio of two neighbouring batches is far steadier than either figure alone. The
median ratio is printed (this checkout over DIR: below 1 means this checkout is cheaper).

``--terms`` names what each ask carries besides the usual (``TERMS``: none, a tenant, rates on
the key or the tenant that never run out); ``--vs-terms`` alternates with another set on the
same scripts, so the ratio is what those terms cost a call.
"""

from __future__ import annotations

import argparse
import statistics
import uuid
from pathlib import Path
from typing import Any

import redis

from celery_fair.core import CostLifecycle
from celery_fair.store import Ask, Done, RedisStore, Verdict
from celery_fair.store import redis as redis_store
from celery_fair.store.wire import lua_constants

URL = "redis://127.0.0.1:6379/0"

#: What an ask carries besides the usual, by name (``--terms``): rates far above what the replay
#: starts, so every ask is admitted and each call reads and charges the buckets.
_FAST = 1e9
TERMS: dict[str, dict[str, Any]] = {
    "flat": {},
    "tenant": {"tenant": "acme"},
    "key-rate": {"rate": _FAST, "burst": _FAST},
    "tenant-rate": {"tenant": "acme", "tenant_rate": _FAST, "tenant_burst": _FAST},
}


class Replay:
    """A worker's stream of admit calls on a prefix of its own, ``2 * batch`` jobs running."""

    def __init__(
        self, client: redis.Redis, lua: Path | None, batch: int = 1, terms: str = "flat"
    ) -> None:
        self.client = client
        self.size = batch
        self.terms = TERMS[terms]
        self.prefix = f"script-bench-{uuid.uuid4().hex[:8]}"
        original = redis_store._source
        if lua is not None:

            def source(name: str) -> str:  # the ARGV names it uses first, as the store does
                body = (lua / "common.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()
                return lua_constants(body) + body

            redis_store._source = source
        try:
            self.store = RedisStore(client, self.prefix, lifecycle=CostLifecycle())
        finally:
            redis_store._source = original
        self.count = 0
        self.running: list[Done] = []
        for _ in range(2):
            self.running += self._admit([])

    def _admit(self, done: list[Done]) -> list[Done]:
        asks = []
        for _ in range(self.size):
            i = self.count
            self.count += 1
            job_id = f"r{i % 50}"
            asks.append(Ask(
                f"job-{i}",
                "bench",
                8,
                None,
                None,
                f"repo\x00{job_id}",
                f"bench\x00{job_id}",
                f"client{i % 10}",
                None,
                1.0,
            )._replace(**self.terms))  # fmt: skip
        grants = self.store.admit("worker", asks, done).grants
        if any(g.verdict is not Verdict.ADMITTED for g in grants):
            raise RuntimeError(f"the replay expected admissions, got {grants}")
        return [Done(a.uid, g.token, 0.001, final=True) for a, g in zip(asks, grants, strict=True)]

    def batch(self, n: int) -> dict[str, Any]:
        """Make ``n`` calls; the commandstats they moved."""
        before = self.client.info("commandstats")
        for _ in range(n):
            done, self.running = self.running[: self.size], self.running[self.size :]
            self.running += self._admit(done)
        after = self.client.info("commandstats")
        return {
            name: (stats["calls"] - before.get(name, {}).get("calls", 0),
                   stats["usec"] - before.get(name, {}).get("usec", 0))
            for name, stats in after.items()
        }  # fmt: skip

    def close(self) -> None:
        self.store.close()
        for key in self.client.scan_iter(match=f"{{{self.prefix}}}:*"):
            self.client.delete(key)


def per_call(moved: dict[str, Any]) -> float:
    calls, usec = moved["cmdstat_evalsha"]
    return float(usec / calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="a folder with another version's scripts")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--size", type=int, default=100, help="calls per batch")
    parser.add_argument("--batch", type=int, default=1, help="ends and admissions per call")
    parser.add_argument("--terms", choices=sorted(TERMS), default="flat")
    parser.add_argument("--vs-terms", choices=sorted(TERMS), help="alternate with these terms")
    args = parser.parse_args()
    client = redis.Redis.from_url(URL)
    ours = Replay(client, None, args.batch, args.terms)
    theirs = None
    if args.against or args.vs_terms:
        theirs = Replay(client, args.against, args.batch, args.vs_terms or args.terms)
    try:
        mine: list[float] = []
        other: list[float] = []
        totals: dict[str, list[int]] = {}
        for _ in range(args.batches):
            moved = ours.batch(args.size)
            mine.append(per_call(moved))
            for name, (calls, usec) in moved.items():
                total = totals.setdefault(name, [0, 0])
                total[0] += calls
                total[1] += usec
            if theirs is not None:
                other.append(per_call(theirs.batch(args.size)))
        n = totals["cmdstat_evalsha"][0]
        print(f"this checkout: {statistics.median(mine):.1f} us of server time per call")
        print("  inside it, per call (calls, us):")
        for name, (calls, usec) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
            if name not in ("cmdstat_evalsha", "cmdstat_info") and calls:
                print(f"    {name[8:]:16} {calls / n:5.2f} {usec / n:7.1f}")
        if theirs is not None:
            ratios = [a / b for a, b in zip(mine, other, strict=True)]
            that = args.against or f"--terms {args.vs_terms}"
            print(f"{that}: {statistics.median(other):.1f} us per call")
            print(f"--terms {args.terms} / that: median of {len(ratios)} batch pairs "
                  f"{statistics.median(ratios):.3f}")  # fmt: skip
    finally:
        ours.close()
        if theirs is not None:
            theirs.close()
        client.close()


if __name__ == "__main__":
    main()
