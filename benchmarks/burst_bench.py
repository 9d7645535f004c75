"""A burst never hides a newcomer: client A publishes a burst, client B two jobs right after.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/burst_bench.py                                  # every cell, 3 runs
    python benchmarks/burst_bench.py --sizes 500,5000 --brokers redis --topologies 1x4
    python benchmarks/burst_bench.py --sizes 500 --runs 1             # to check it runs

Each run starts fresh ``celery worker`` processes on a fresh queue (``1x4``: one worker with
``-c 4``; ``3x2``: three with ``-c 2``), publishes client A's burst of N jobs of 20 ms with
``fairness_key="A"`` and, right after the last one, client B's two with ``"B"`` (B publishes on
a connection of its own, opened before A's burst, as another client would: on one connection
RabbitMQ routes B's messages only once it has routed the rest of A's), and reads
what the jobs recorded in Redis: B's wait (from just before B's first publish to the start of
its last job), how many of A's jobs started in between, and, for bursts up to
``--complete-up-to``, A's completion time (from its first publish to its last job's end).

Variants, in the same rounds (their order alternates from round to round):

- ``plain``: plain Celery (``-P prefork``); the jobs go to the queue itself;
- ``fair/1``: ``-P fair`` with ``fair_shards = 1``: the gate alone, no shards;
- ``fair/8``: ``-P fair`` with 8 shards: ``@fair_task`` publishes to A's and B's shards;
- ``intake/8``: ``-P fair`` with 8 shards, but the producer knows nothing of them: it sends
  every job to the queue itself with ``send_task(..., headers=fair_headers(...))``, and the
  workers' intake moves them into their shards.

``--light N``: instead of B's two jobs, N light clients publish one job each, right after the
burst, on B's connection; ``--light-keys`` names their keys: ``any`` (``light-0`` to
``light-<N-1>``, which nobody chose for their hash), ``colliding`` (the first N ``light-<i>``
that ``protocol.shard_of`` puts in A's shard) or ``apart`` (the first N it puts elsewhere). The
wait is then the slowest light client's (to its job's start), beside the median client's.

``--heavy K``: K heavy clients instead of A alone (keys ``A``, ``A1`` ... ``A<K-1>``), each with
a burst of N jobs, published in turns, one job of each in turn, as K clients publishing at once
would; "A" in the table counts all of them (``colliding`` light keys collide with ``A``).

``--against DIR``: each fair variant also runs with ``celery_fair`` imported by the workers from
``DIR`` (the ``src`` folder of another checkout, e.g. ``git worktree add /tmp/base 6da9c74``),
in the same rounds; its rows say ``VARIANT@base``. The producer is this checkout's either way.

The table gives, per cell, the median and the maximum over the runs of B's wait (with
``--light``, the slowest light client's; ``mid light``: the median light client's, median over
the runs) and of A's jobs started in between, and A's completion time over plain Celery's in
the same round.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from kombu import Producer

from celery_fair.core.lanes import LaneMap
from celery_fair.protocol import lane_name, shard_of

HERE = Path(__file__).resolve().parent
BROKERS = {
    "redis": "redis://127.0.0.1:6379/4",
    "amqp": "amqp://guest:guest@127.0.0.1:5672//",
}
RECORD = "redis://127.0.0.1:6379/0"
SECONDS = 0.02
VARIANTS = ("plain", "fair/1", "fair/8", "intake/8")


@dataclass
class Result:
    b_wait: float | None  # seconds from B's publish to its last job's start; None: > patience
    a_between: int  # A's jobs that started in that time (or before we gave up)
    a_complete: float | None  # seconds from A's first publish to A's last end
    light_median: float | None = None  # with --light: the median light client's wait


def light_keys(count: int, how: str, shards: int = 8) -> list[str]:
    """The keys of ``count`` light clients (``--light-keys``), ``light-<i>`` for rising i.

    >>> all(shard_of(k, 8) == shard_of("A", 8) for k in light_keys(3, "colliding"))
    True
    >>> light_keys(2, "any")
    ['light-0', 'light-1']
    """
    heavy = shard_of("A", shards)
    keep = {
        "any": lambda key: True,
        "colliding": lambda key: shard_of(key, shards) == heavy,
        "apart": lambda key: shard_of(key, shards) != heavy,
    }[how]
    keys: list[str] = []
    i = 0
    while len(keys) < count:
        if keep(f"light-{i}"):
            keys.append(f"light-{i}")
        i += 1
    return keys


def heavy_keys(count: int) -> list[str]:
    """The keys of ``count`` heavy clients (``--heavy``).

    >>> heavy_keys(3)
    ['A', 'A1', 'A2']
    """
    return ["A", *(f"A{i}" for i in range(1, count))]


def wait_for_lanes(app: Any, patience: float = 10.0) -> None:
    """Until the workers have told the shared store they consume lanes (none without a
    store): a fleet that runs before a burst comes, as in production."""
    from celery_fair.connect import settings_of, shared_store

    store = shared_store(app)  # the app's own (its producers' lanes use it too): kept open
    if store is None or settings_of(app).lanes == 0:
        return
    deadline = time.time() + patience
    while (store.lanes(-1) or LaneMap(-1, {})).size == 0:
        if time.time() > deadline:
            raise RuntimeError("the workers did not announce their lanes")
        time.sleep(0.05)


def app_for(broker: str, queue: str, key: str, shards: int) -> Any:
    sys.path.insert(0, str(HERE))
    os.environ.update(
        BURST_BROKER=broker, BURST_QUEUE=queue, BURST_KEY=key, BURST_SHARDS=str(shards)
    )
    import importlib

    import burst_app

    return importlib.reload(burst_app)


def start_workers(variant: str, topology: str, env: dict[str, str], queue: str) -> list[Any]:
    count, concurrency = (int(x) for x in topology.split("x"))
    procs = []
    for i in range(count):
        command = [sys.executable, "-m", "celery", "-A", "burst_app", "worker"]
        command += ["-P", "prefork" if variant == "plain" else "fair", "-c", str(concurrency)]
        command += ["-Q", queue, "-n", f"burst{i}-{queue}@%h", "--without-mingle"]
        command += ["--without-gossip", "-l", "WARNING"]
        procs.append(
            subprocess.Popen(
                command,
                cwd=HERE,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        )
    return procs


def run_once(
    broker: str,
    variant: str,
    topology: str,
    size: int,
    complete: bool,
    patience: float,
    against: str | None = None,
    light: list[str] | None = None,
    heavy: int = 1,
) -> Result:
    variant, at, _ = variant.partition("@")
    path = f"{against}{os.pathsep}{HERE}" if at and against else str(HERE)
    queue = f"burst-{uuid.uuid4().hex[:8]}"
    key = f"burst:{queue}"
    shards = 1 if variant in ("plain", "fair/1") else 8
    module = app_for(BROKERS[broker], queue, key, shards)
    record = redis.Redis.from_url(RECORD)
    env = {**os.environ, "PYTHONPATH": path, "BURST_SHARDS": str(shards)}
    procs = start_workers(variant, topology, env, queue)
    b_connection = None
    try:
        workers = len(procs)
        deadline = time.time() + 60
        while len(module.app.control.ping(timeout=0.5) or []) < workers:
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{variant} workers did not start")
        if shards > 1:  # a fleet that is up: its lanes agreed (docs/operations.md, Lanes)
            wait_for_lanes(module.app)
        unaware = variant.startswith("intake")
        b_connection = module.app.connection_for_write()
        b_connection.ensure_connection()
        b_producer = Producer(b_connection)

        def publish(client: str, record_as: str) -> None:
            # record_as: the name its start and end are recorded under (burst_app.py)
            producer = None if client == "A" else b_producer
            task_id = f"{client}/{uuid.uuid4().hex}"
            if unaware:
                from celery_fair import fair_headers

                module.app.send_task(
                    "burst.job",
                    [record_as, SECONDS],
                    headers=fair_headers("burst", client),
                    producer=producer,
                    task_id=task_id,
                )
            else:
                module.job.apply_async(
                    [record_as, SECONDS], fairness_key=client, producer=producer, task_id=task_id
                )

        a_published = time.time()
        clients = heavy_keys(heavy)
        for _ in range(size):
            for client in clients:
                publish(client, "A")
        b_published = time.time()
        newcomers = light or ["B", "B"]
        for client in newcomers:
            publish(client, "B")
        limit = time.time() + patience
        while record.zcard(f"{key}:start:B") < len(newcomers):
            if time.time() > limit:  # B waits behind the burst: say how long we waited
                return Result(None, int(record.zcard(f"{key}:start:A")), None)
            time.sleep(0.01)
        b_starts = record.zrange(f"{key}:start:B", 0, -1, withscores=True)
        b_started = max(score for _, score in b_starts)
        light_median = None
        if light:
            first: dict[str, float] = {}
            for member, score in b_starts:
                client = member.decode().partition("/")[0]
                first[client] = min(score, first.get(client, score))
            light_median = statistics.median(first.values()) - b_published
        a_between = int(record.zcount(f"{key}:start:A", f"({b_published}", f"({b_started}"))
        a_complete = None
        limit = time.time() + 900
        if complete:
            while record.zcard(f"{key}:end:A") < size * heavy:
                if time.time() > limit:
                    raise RuntimeError(f"A did not finish ({variant}, {broker}, {topology})")
                time.sleep(0.05)
            last = record.zrange(f"{key}:end:A", -1, -1, withscores=True)[0][1]
            a_complete = last - a_published
        return Result(b_started - b_published, a_between, a_complete, light_median)
    finally:
        if b_connection is not None:
            b_connection.release()
        finish(procs, module, queue, record, key, ["A", "B"])


def finish(procs: list[Any], module: Any, queue: str, record: Any, key: str, names: Any) -> None:
    """Stop a run's workers (by PID), and delete what it left: the records of ``names``, its
    queue with its shards and lanes (up to 16 each), its store's keys."""
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    for name in names:
        record.delete(f"{key}:start:{name}", f"{key}:end:{name}")
    parts = [f"{queue}.fair.{i}" for i in range(16)] + [lane_name(queue, j) for j in range(16)]
    with module.app.connection_for_write() as conn:
        for name in (queue, *parts):
            conn.default_channel.queue_delete(name)
    store = redis.Redis.from_url(BROKERS["redis"])
    for stale in store.scan_iter(match=f"*burst-{queue}*"):
        store.delete(stale)
    module.app.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500,5000,50000")
    parser.add_argument("--brokers", default="redis,amqp")
    parser.add_argument("--topologies", default="1x4,3x2", help="WORKERSxCONCURRENCY, ...")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--settings",
        default="",
        help="more fair_* settings for the workers, a Python dict literal, e.g. "
        "'{\"fair_max_held\": 8}'",
    )
    parser.add_argument(
        "--complete-up-to",
        type=int,
        default=5000,
        help="measure A's completion for bursts up to this size (larger: B only)",
    )
    parser.add_argument(
        "--patience",
        type=float,
        default=120.0,
        help="seconds to wait for B before recording it as waiting longer than that",
    )
    parser.add_argument(
        "--light",
        type=int,
        default=0,
        help="N light clients of one job each instead of B's two (0: B)",
    )
    parser.add_argument(
        "--light-keys",
        default="any",
        choices=("any", "colliding", "apart"),
        help="the light clients' keys against A's shard (module docstring)",
    )
    parser.add_argument(
        "--heavy", type=int, default=1, help="K heavy clients of N jobs each (module docstring)"
    )
    parser.add_argument(
        "--against",
        default=None,
        help="the src folder of another checkout: each fair variant runs with it too",
    )
    args = parser.parse_args()
    os.environ["BURST_SETTINGS"] = args.settings
    variants = args.variants.split(",")
    light = light_keys(args.light, args.light_keys) if args.light else None
    if light:
        print(f"light clients ({args.light_keys}): {', '.join(light)}")
    against = str(Path(args.against).resolve()) if args.against else None
    if against:
        variants += [f"{v}@base" for v in variants if v != "plain"]
    print(f"(B waits longer than --patience {args.patience:.0f} s: shown as '>')")
    print(
        f"{'broker':6} {'workers':7} {'burst':>6} {'variant':13} {'B wait p50':>10} "
        f"{'B wait max':>10} {'A between p50':>13} {'max':>5} {'A done p50':>10} "
        f"{'A done/plain':>12} {'mid light':>9}"
    )
    for broker in args.brokers.split(","):
        for topology in args.topologies.split(","):
            for size in (int(s) for s in args.sizes.split(",")):
                complete = size <= args.complete_up_to
                got: dict[str, list[Result]] = {v: [] for v in variants}
                for i in range(args.runs):
                    for variant in variants if i % 2 == 0 else variants[::-1]:
                        got[variant].append(
                            run_once(
                                broker,
                                variant,
                                topology,
                                size,
                                complete,
                                args.patience,
                                against,
                                light,
                                args.heavy,
                            )
                        )
                for variant in variants:
                    report(broker, topology, size, variant, got[variant], got.get("plain"))


def report(
    broker: str,
    topology: str,
    size: int,
    variant: str,
    results: list[Result],
    plain: list[Result] | None,
) -> None:
    waits = [r.b_wait for r in results]
    mids = [r.light_median for r in results]
    between = [r.a_between for r in results]
    ratio = "-"
    done = [r.a_complete for r in results]
    base = [p.a_complete for p in plain or []]
    if base and all(done) and all(base):
        ratios = [d / b for d, b in zip(done, base, strict=True)]  # type: ignore[operator]
        ratio = f"{statistics.median(ratios):.3f}"
    worst = None if None in waits else max(w for w in waits if w is not None)
    took = "-" if not all(done) else f"{statistics.median(done):.2f}s"  # type: ignore[type-var]
    print(
        f"{broker:6} {topology:7} {size:>6} {variant:13} {_ms(_median(waits)):>10} "
        f"{_ms(worst):>10} {statistics.median(between):>13.0f} {max(between):>5} {took:>10} "
        f"{ratio:>12} {_ms(_median(mids)) if any(mids) else '-':>9}",
        flush=True,
    )


def _median(values: list[float | None]) -> float | None:
    """The median, with ``None`` (longer than patience) above every number."""
    ordered = sorted(values, key=lambda v: float("inf") if v is None else v)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    low, high = ordered[middle - 1], ordered[middle]
    return None if low is None or high is None else (low + high) / 2


def _ms(value: float | None) -> str:
    return ">" if value is None else f"{value * 1000:.0f}ms"


if __name__ == "__main__":
    main()
