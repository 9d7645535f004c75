"""A key's share: one tenant's ten backlogged keys against another tenant's one key.

Run by hand (docs/design.md section 5f, measurement 2; results in docs/benchmarks.md):

    python benchmarks/share_bench.py                      # both brokers, 3 runs
    python benchmarks/share_bench.py --brokers redis --runs 1
    python benchmarks/share_bench.py --variants hash/8,tenants/8 --each   # and every run

Each run starts one fresh ``celery worker -c 4`` on a fresh queue. Tenant T publishes
``--per-key`` jobs of 50 ms on each of its ten keys (round robin); right after, the solo tenant
publishes as many on its one key (``tenants/8``: as many as T's ten keys together). Every key
stays backlogged through the window (``--window`` seconds from solo's first publish), over
which we measure solo's share of the slot-time (each job's run clipped to the window). The
fairness rule gives each of the eleven keys the same share: 1/11 = 0.091, once solo has caught
up with what each of T's keys was charged before it came (solo's cost starts from nothing).

With two levels (``tenants/8``) T is one tenant of ten keys, and the rule serves the tenants
fairly first, then the keys of the chosen tenant: solo first catches up with what tenant T
was charged before it came (every start goes to solo until its cost reaches T's, the sum of
its ten keys'), then gets half: over the window, 1/2 + C / (2 x S), while C < S, with C what T
was charged before solo came, in jobs (its cost over the learned estimate), and S the jobs
started in the window.

Beside the measured share, the ``tenants/8`` row gives the rule's (``rule``): solo's share of
the window's starts if each went to the tenant of the least cost, then to that tenant's key
of the least (``rule_share``), starting from T's keys' accumulated costs in the shared store
just before solo's first publish, in jobs of the learned estimate (``RedisStore.estimate``).
These are more than T's starts: the first jobs of the type are charged its ``default_cost``
(1 s) before the estimate has learned 50 ms; without a store, T's starts stand for them. The
row also gives solo's share over the window's second half (``late``), once it has caught up
(the rule's there: 1/2), beside the rule's for the starts of that half.
``--each`` prints every run as it ends: its share, T's starts and cost (in jobs) before solo
came, the window's starts and the rule's share for the variant's keys (flat keys for
``hash/8`` and ``apart/16``), and both over the second half.

Variants, in the same rounds (their order alternates from round to round):

- ``plain``: plain Celery (``-P prefork``), one queue: solo waits behind T's backlog;
- ``hash/8``: ``-P fair``, 8 shards, keys ``t-0`` to ``t-9`` and ``solo``, which nobody chose
  for their hash: keys that share a shard share its FIFO, until they get lanes (with a store,
  as by default: every key here turns heavy, and has a lane of its own);
- ``apart/16``: ``-P fair``, 16 shards, the eleven keys chosen (``protocol.shard_of``) so that
  each has a shard of its own: a stand-in for a queue per backlogged key;
- ``tenants/8``: as ``hash/8``, with two-level keys: ``fair_key_separator = "/"`` for the
  producer and the worker (added to ``BURST_SETTINGS``, burst_app.py), T's keys ``t/0`` to
  ``t/9`` (tenant ``t``) and solo's ``solo`` (a tenant of one key); solo publishes as many
  jobs as T's ten keys together (10 x ``--per-key``), to stay backlogged at half the slots and
  more (with ``--per-key`` jobs solo would run out within the window).
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis

from burst_bench import BROKERS, RECORD, app_for, finish, start_workers, wait_for_lanes
from celery_fair.connect import shared_store
from celery_fair.protocol import shard_of

SECONDS = 0.05
VARIANTS = ("plain", "hash/8", "apart/16", "tenants/8")
SHARDS = {"plain": 1, "hash/8": 8, "apart/16": 16, "tenants/8": 8}
SEPARATOR = {"tenants/8": "/"}  # fair_key_separator by variant; the others: flat keys


@dataclass
class Run:
    share: float  # solo's share of the slot-time over the window
    started: int  # T's jobs started before solo's first publish
    charged: float  # T's cost then, in jobs of the learned estimate (no store: started)
    starts: int  # jobs (T's and solo's) started within the window
    rule: float  # solo's share of those starts by the rule (rule_share)
    late: float  # solo's share of the slot-time over the window's second half
    late_rule: float  # the rule's share of the starts in the second half


def keys_for(variant: str) -> tuple[list[str], str]:
    """T's ten keys and solo's key for ``variant``.

    >>> tenant, solo = keys_for("apart/16")
    >>> len({shard_of(k, 16) for k in [*tenant, solo]})
    11
    """
    if variant == "tenants/8":
        return [f"t/{i}" for i in range(10)], "solo"
    if variant != "apart/16":
        return [f"t-{i}" for i in range(10)], "solo"
    taken: set[int] = set()

    def pick(prefix: str, count: int) -> list[str]:
        out, i = [], 0
        while len(out) < count:
            shard = shard_of(f"{prefix}-{i}", 16)
            if shard not in taken:
                taken.add(shard)
                out.append(f"{prefix}-{i}")
            i += 1
        return out

    tenant = pick("t", 10)
    return tenant, pick("solo", 1)[0]


def rule_share(
    before: dict[str, float], solo: str, starts: int, separator: str | None, skip: int = 0
) -> float:
    """Solo's share of ``starts`` starts of alike jobs by the rule (of those after the first
    ``skip``), after ``before`` (each of T's keys: its cost before solo came, in jobs): each
    start goes to the tenant of the least cost so far, then to that tenant's key of the least
    (flat keys: ``separator`` ``None``, each key a tenant of its own).

    >>> rule_share({"t/0": 10, "t/1": 10}, "solo", 40, "/")  # 20 to catch up, then half
    0.75
    >>> rule_share({"t/0": 10, "t/1": 10}, "solo", 40, "/", skip=20)
    0.5
    >>> rule_share({"t-0": 10, "t-1": 10}, "solo", 40, None)  # 10, then a third
    0.5
    """
    if starts <= skip:
        return 0.0
    used = {**before, solo: 0.0}

    def tenant(key: str) -> str:
        return key.partition(separator)[0] if separator else key

    mine = 0
    for i in range(starts):
        by_tenant: dict[str, float] = {}
        for k, n in used.items():
            by_tenant[tenant(k)] = by_tenant.get(tenant(k), 0) + n
        chosen = min(by_tenant, key=lambda t: (by_tenant[t], t))
        k = min((k for k in used if tenant(k) == chosen), key=lambda k: (used[k], k))
        used[k] += 1
        mine += k == solo and i >= skip
    return mine / (starts - skip)


def settings_for(variant: str, given: str) -> str:
    """``BURST_SETTINGS`` for ``variant``'s producer and workers (burst_app.py): ``given``
    (the caller's), with ``fair_key_separator`` for two-level keys.

    >>> settings_for("tenants/8", ""), settings_for("hash/8", "")
    ("{'fair_key_separator': '/'}", '')
    >>> settings_for("tenants/8", "{'fair_lanes': 0}")
    "{'fair_lanes': 0, 'fair_key_separator': '/'}"
    """
    if variant not in SEPARATOR:
        return given
    return repr({**ast.literal_eval(given or "{}"), "fair_key_separator": SEPARATOR[variant]})


def busy(record: redis.Redis, key: str, name: str, start: float, end: float) -> float:
    """Seconds ``name``'s jobs ran within [start, end] (a job still running counts to ``end``)."""
    began = dict(record.zrange(f"{key}:start:{name}", 0, -1, withscores=True))
    ended = dict(record.zrange(f"{key}:end:{name}", 0, -1, withscores=True))
    total = 0.0
    for member, at in began.items():
        until = ended.get(member, end)
        total += max(0.0, min(until, end) - max(at, start))
    return total


def run_once(broker: str, variant: str, per_key: int, window: float) -> Run:
    queue = f"share-{uuid.uuid4().hex[:8]}"
    key = f"share:{queue}"
    shards = SHARDS[variant]
    given = os.environ.get("BURST_SETTINGS")
    os.environ["BURST_SETTINGS"] = settings_for(variant, given or "")  # read by app_for
    try:
        module = app_for(BROKERS[broker], queue, key, shards)
        env = {**os.environ, "BURST_SHARDS": str(shards)}
    finally:
        if given is None:
            del os.environ["BURST_SETTINGS"]
        else:
            os.environ["BURST_SETTINGS"] = given
    record = redis.Redis.from_url(RECORD)
    procs = start_workers("plain" if variant == "plain" else "fair", "1x4", env, queue)
    tenant, solo = keys_for(variant)
    try:
        deadline = time.time() + 60
        while not module.app.control.ping(timeout=0.5):
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{variant} worker did not start")
        if shards > 1:
            wait_for_lanes(module.app)
        publish: Callable[[str], object] = lambda k: module.job.apply_async(  # noqa: E731
            [k, SECONDS], fairness_key=k
        )
        for _ in range(per_key):
            for k in tenant:
                publish(k)
        costs = None  # T's keys' costs in the store (in jobs), just before solo's publish
        store = shared_store(module.app) if variant != "plain" else None
        if store is not None:
            estimate = store.estimate("burst", None, 1.0)
            costs = {k: store.accumulated_cost(k) / estimate for k in tenant}
        solo_published = time.time()
        for _ in range(per_key * (len(tenant) if variant in SEPARATOR else 1)):
            publish(solo)
        end = solo_published + window
        while time.time() < end + SECONDS * 2:
            time.sleep(0.05)
        mine = busy(record, key, solo, solo_published, end)
        theirs = sum(busy(record, key, k, solo_published, end) for k in tenant)
        middle = solo_published + window / 2
        late = busy(record, key, solo, middle, end)
        late_all = late + sum(busy(record, key, k, middle, end) for k in tenant)
        started = {
            k: int(record.zcount(f"{key}:start:{k}", "-inf", f"({solo_published}")) for k in tenant
        }
        before: dict[str, float] = {**started, **(costs or {})}
        everyone = [*tenant, solo]
        starts = sum(int(record.zcount(f"{key}:start:{k}", solo_published, end)) for k in everyone)
        early = sum(  # started in the window's first half
            int(record.zcount(f"{key}:start:{k}", solo_published, f"({middle}")) for k in everyone
        )
        separator = SEPARATOR.get(variant)
        return Run(
            mine / (mine + theirs) if mine + theirs else 0.0,
            sum(started.values()),
            sum(before.values()),
            starts,
            rule_share(before, solo, starts, separator),
            late / late_all if late_all else 0.0,
            rule_share(before, solo, starts, separator, skip=early),
        )
    finally:
        finish(procs, module, queue, record, key, [*tenant, solo])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="redis,amqp")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-key", type=int, default=100)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument(
        "--each",
        action="store_true",
        help="print every run as it ends (its share, T's starts before solo came, the rule's)",
    )
    args = parser.parse_args()
    variants = args.variants.split(",")
    print(f"solo's share of the slot-time over {args.window:.0f} s; the rule gives 1/11 = 0.091")
    if "tenants/8" in variants:
        print(
            "tenants/8 (two levels): solo first catches up with what tenant t was charged "
            "before it came, then gets 1/2 (rule: that share of the window's starts, p50; "
            "late: the window's second half)"
        )
    print(f"{'broker':6} {'variant':9} {'p50':>6} {'min':>6} {'max':>6}  keys")
    for broker in args.brokers.split(","):
        got: dict[str, list[Run]] = {v: [] for v in variants}
        for i in range(args.runs):
            for variant in variants if i % 2 == 0 else variants[::-1]:
                run = run_once(broker, variant, args.per_key, args.window)
                got[variant].append(run)
                if args.each:
                    fair = (  # plain Celery charges nothing: no rule to compare with
                        f"; was charged {run.charged:.1f} jobs; starts in the window "
                        f"{run.starts}, rule {run.rule:.3f}; second half {run.late:.3f}, rule "
                        f"{run.late_rule:.3f}"
                    )
                    print(
                        f"  {broker} run {i + 1} {variant}: share {run.share:.3f}; before "
                        f"solo T started {run.started}{'' if variant == 'plain' else fair}",
                        flush=True,
                    )
        for variant in variants:
            shares = [r.share for r in got[variant]]
            tenant, solo = keys_for(variant)
            n = 16 if variant == "apart/16" else 8
            rule = ""
            if variant in SEPARATOR:
                runs = got[variant]
                rule = (
                    f"rule {statistics.median(r.rule for r in runs):.3f}; late "
                    f"{statistics.median(r.late for r in runs):.3f} (rule "
                    f"{statistics.median(r.late_rule for r in runs):.3f}); "
                )
            print(
                f"{broker:6} {variant:9} {statistics.median(shares):6.3f} {min(shares):6.3f} "
                f"{max(shares):6.3f}  {rule}solo's shard of {n}: {shard_of(solo, n)}; "
                f"T's: {sorted(shard_of(k, n) for k in tenant)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
