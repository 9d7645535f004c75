"""Worker throughput: plain Celery (``-P prefork``) against ``-P fair``, interleaved pairs.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/worker_bench.py                       # both brokers and states, 5 pairs
    python benchmarks/worker_bench.py --brokers redis --states redis --pairs 3 --quick
    python benchmarks/worker_bench.py --states redis --lookahead 0   # fair_lookahead = 0

Each measurement publishes N tasks to a fresh queue, starts a fresh ``celery worker`` process
(prefork either way, concurrency 2), and measures from the first task start to the N-th task end,
read from what the tasks record in Redis. The same fair tasks run in both modes: without the
fair pool their headers are simply ignored. A pair is one plain run and one fair run, back to
back, order alternating; the ratio reported is the median over pairs of fair/plain throughput.

On a shared, noisy host one run's ratio moves by several percent from one run to the next.
The ``cpu`` columns are steadier: the CPU time (user + system, from ``/proc``) the worker's
main process spends per task, from the first task's start to the last one's end, median over
pairs. For no-op tasks that process is the bottleneck, so a change to the gate or the store
shows there first. The ``redis`` columns are the local Redis server's CPU per task over the
same span (the broker's work, the tasks' own counting, and the store's scripts): Redis shares
the two cores with the worker, so what the store makes it do is taken from the worker too.
The ``pre`` columns count how often per task the worker's main process was taken off the CPU
while it could have run (``nonvoluntary_ctxt_switches``): the time another process (Redis,
woken by a call; a pool process) took from it, which its CPU time does not show.

``--against DIR``: also run the fair worker with ``celery_fair`` imported from ``DIR`` (the
``src`` folder of another checkout, e.g. ``git worktree add /tmp/base HEAD~1``), in the same
rounds, so two versions are compared against the same plain runs; rows for it say
``fair@DIR``. ``--variant NAME=SETTINGS`` does the same for settings: one more fair worker
with the ``fair_*`` settings of a Python dict literal on top of the bench app's, e.g.
``--variant 'uncapped={"fair_tier_caps": {8: None}}'``; rows for it say ``fair+NAME``.

``--code DIR``: every worker of the run (plain, fair, ``--variant``), and this process's
publishes, import ``celery_fair`` from ``DIR`` instead of the installed one: to measure a
commit (``git archive REV src | tar -x -C /tmp/this``) while the working tree changes.

``--shards N``: the fair worker's tasks go to its queue's N shard queues (``fair_shards``;
8 by default, 1 for none), and it consumes them all; plain Celery's go to the queue.

``--profile DIR``: sample the worker's main process with py-spy (``pip install py-spy``;
it reads the process from outside, so the worker runs unchanged) from the first task's start
to the last one's end, 250 times a second, and write each run's folded stacks to ``DIR``
(``<broker>-<state>-<task>-<name>-<pair>.txt``, one line per stack and its samples: the input
of ``flamegraph.pl``, or of ``benchmarks/profile_table.py`` for a table by stage). Sampling
costs the worker a little: compare ratios from runs without it. With ``BENCH_GIL=1`` in the
environment only the thread holding the GIL is sampled (py-spy's ``--gil``): the Python work
that the main process's threads (the loop, the intake, the lane watch) take turns at.

``--syscalls DIR``: count the worker's main process's system calls (every thread) over the
same span with ``perf trace -s`` (Linux; root or ``perf_event_paranoid`` low enough), each
run's summary in ``DIR`` as above: the calls of each kind per thread and the time they took.

``--commandstats DIR``: what the local Redis server did over the same span, by command, per
task (``INFO commandstats`` read at both ends: calls and microseconds), each run's table in
``DIR`` as above. It counts every client of that server (the broker, the store, the record).

``--pin`` (Linux, two CPUs or more): once the first task has started, the worker's main
process (every thread) runs on CPU 0 and its pool processes and the local Redis server on
CPU 1 (Redis gets all CPUs back at the end of each run). On two shared cores the main process
is otherwise taken off its CPU about once a task (``pre``), and a profile then charges that
time to whatever it was doing; pinned, ``pre`` falls to about 0.3.

``--states``: where the fair worker keeps its shared state: ``memory`` (this worker alone) or
``redis`` (the shared store: the broker's Redis on the Redis broker, the local Redis named by
``fair_store_url`` on RabbitMQ), each under a fresh prefix. ``--store-url`` puts the store on
another Redis (e.g. a second ``redis-server`` on another port, so that the store's scripts and
the broker's commands do not share one Redis thread).
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import redis

HERE = Path(__file__).resolve().parent
BROKERS = {
    "redis": "redis://127.0.0.1:6379/4",
    "amqp": "amqp://guest:guest@127.0.0.1:5672//",
}
RECORD = "redis://127.0.0.1:6379/0"
STATES = {"memory": "memory", "redis": "redis://127.0.0.1:6379/4"}
SHARDS = 8  # fair_shards of the fair worker (--shards)


def bench_app(broker: str, queue: str, key: str, shards: int):  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(HERE))
    os.environ.update(
        BENCH_BROKER=broker, BENCH_QUEUE=queue, BENCH_KEY=key, BENCH_SHARDS=str(shards)
    )
    import importlib

    import bench_app as module

    return importlib.reload(module)


class Measured(NamedTuple):
    rate: float  # tasks per second, first start to last end
    cpu_us: float | None  # the worker's main-process CPU per task, in us (None off Linux)
    redis_us: float | None  # the local Redis server's CPU per task, in us (None off Linux)
    preempted: float | None  # the worker's main process taken off the CPU per task


def _preemptions(pid: int) -> int | None:
    """Times process ``pid`` was taken off the CPU while it could have run (Linux)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("nonvoluntary_ctxt_switches:"):
            return int(line.split()[1])
    return None


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` so far (Linux ``/proc``), or ``None``."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    broker: str,
    mode: str,
    task: str,
    n: int,
    concurrency: int,
    state: str,
    lookahead: int | None = None,
    code: str | None = None,
    settings: str = "",
    shards: int = SHARDS,
    profile: Path | None = None,
    pin: bool = False,
    syscalls: Path | None = None,
    commands: Path | None = None,
) -> Measured:
    """Throughput and CPU per task for one fresh worker running ``n`` pre-published tasks.

    The fair worker's tasks are published to ``shards`` shard queues (one: none); plain
    Celery's to the queue, which is all a plain worker consumes."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    key = f"bench:{queue}"
    if mode != "fair":
        shards = 1
    elif settings:  # a --variant may set its own fair_shards: publish to match
        shards = ast.literal_eval(settings).get("fair_shards", shards)
    module = bench_app(BROKERS[broker], queue, key, shards)
    record = redis.Redis.from_url(RECORD)
    redis_pid = int(record.info("server")["process_id"])
    target = module.noop if task == "noop" else module.sleep10
    for i in range(n):
        target.apply_async(fairness_key=f"client{i % 10}", job_id=f"r{i % 50}")
    env = {
        **os.environ,
        # code: another celery_fair to import (it goes before the installed one)
        "PYTHONPATH": os.pathsep.join([code, str(HERE)] if code else [str(HERE)]),
        "BENCH_STORE": STATES[state],
        "BENCH_LOOKAHEAD": "" if lookahead is None else str(lookahead),
        "BENCH_SETTINGS": settings,
        "BENCH_SHARDS": str(shards),
    }
    pool = "fair" if mode == "fair" else "prefork"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench_app",
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-Q",
            queue,
            "--without-mingle",
            "--without-gossip",
            "-l",
            "WARNING",
        ],
        cwd=HERE,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    spy: subprocess.Popen[bytes] | None = None
    tracer: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.time() + 300
        started, cpu_start, redis_start, preempted_start = 0, None, None, None
        while (count := int(record.get(f"{key}:count") or 0)) < n:
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"{mode} worker on {broker} did not finish")
            if count and cpu_start is None:
                started, cpu_start = count, _cpu_seconds(proc.pid)
                redis_start = _cpu_seconds(redis_pid)
                commands_start = record.info("commandstats") if commands else {}
                preempted_start = _preemptions(proc.pid)
                if pin:
                    _pin(proc.pid, redis_pid)
                if profile is not None:
                    spy = _spy(proc.pid, profile, gil=os.environ.get("BENCH_GIL") == "1")
                if syscalls is not None:
                    tracer = _trace(proc.pid, syscalls)
            time.sleep(0.005 if cpu_start is None else 0.05)
        cpu_end = _cpu_seconds(proc.pid)
        redis_end = _cpu_seconds(redis_pid)
        if commands is not None:
            _write_commands(commands, commands_start, record.info("commandstats"), n - started)
        preempted_end = _preemptions(proc.pid)
        first = float(record.get(f"{key}:first") or 0)
        last = float(record.get(f"{key}:last") or 0)
    finally:
        if pin:
            os.sched_setaffinity(redis_pid, range(os.cpu_count() or 1))
        for watcher in (spy, tracer):
            if watcher is not None:
                watcher.send_signal(signal.SIGINT)  # it writes what it saw, and exits
                watcher.wait(60)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        record.delete(f"{key}:count", f"{key}:first", f"{key}:last")
        store = redis.Redis.from_url(STATES["redis"])
        for stale in store.scan_iter(match=f"{{bench-{queue}}}:*"):
            store.delete(stale)
        with module.app.connection_for_write() as conn:
            for name in (queue, *(f"{queue}.fair.{i}" for i in range(shards))):
                conn.default_channel.queue_delete(name)
    return Measured(
        (n - 1) / (last - first),
        _per_task(cpu_start, cpu_end, n - started),
        _per_task(redis_start, redis_end, n - started),
        _per_task(preempted_start, preempted_end, n - started, scale=1.0),
    )


def _pin(worker: int, redis_pid: int) -> None:
    """``--pin``: the worker's main process (every thread) on CPU 0, its pool processes and
    the Redis server on CPU 1, so that nothing but its own threads takes the main process's
    core."""
    for thread in os.listdir(f"/proc/{worker}/task"):
        os.sched_setaffinity(int(thread), {0})
    found = subprocess.run(["pgrep", "-P", str(worker)], capture_output=True, text=True)
    for child in found.stdout.split():
        os.sched_setaffinity(int(child), {1})
    os.sched_setaffinity(redis_pid, {1})


def _profile_path(
    profiles: Path | None, broker: str, state: str, task: str, name: str, pair: int
) -> Path | None:
    """Where one run's py-spy samples go (``--profile``), or ``None`` without it."""
    if profiles is None:
        return None
    return profiles / f"{broker}-{state}-{task}-{name}-{pair}.txt".replace("/", "_")


def _spy(pid: int, out: Path, gil: bool = False) -> subprocess.Popen[bytes]:
    """py-spy sampling process ``pid`` into ``out`` (folded stacks) until it gets SIGINT;
    with ``gil``, only the thread holding the GIL."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    spy = subprocess.Popen(
        [exe, "record", "--pid", str(pid), "--rate", "250", "--format", "raw",
         "--nonblocking", "--output", str(out), *(["--gil"] if gil else [])],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return spy


def _trace(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """``perf trace -s`` counting process ``pid``'s system calls (every thread), with the time
    each kind took, into ``out`` until it gets SIGINT; with ``BENCH_PERF_RECORD=1`` in the
    environment, ``perf record`` sampling where its CPU goes instead (``perf report -i out``)."""
    if os.environ.get("BENCH_PERF_RECORD") == "1":
        command = ["perf", "record", "-F", "997", "-g", "-p", str(pid), "-o", str(out)]
    else:
        command = ["perf", "trace", "-s", "-p", str(pid), "-o", str(out)]
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _write_commands(out: Path, before: dict, after: dict, tasks: int) -> None:
    """The Redis server's commands over a run (``INFO commandstats``, both readings), per task:
    calls and microseconds, the most expensive first."""
    rows = []
    for name, stats in after.items():
        was = before.get(name, {"calls": 0, "usec": 0})
        calls, usec = stats["calls"] - was["calls"], stats["usec"] - was["usec"]
        if calls:
            rows.append((usec / tasks, calls / tasks, name.removeprefix("cmdstat_")))
    lines = [f"{'command':24} {'calls/task':>10} {'µs/task':>8} {'µs/call':>8}"]
    for usec, calls, name in sorted(rows, reverse=True):
        lines.append(f"{name:24} {calls:>10.3f} {usec:>8.1f} {usec / calls:>8.1f}")
    lines.append(f"{'all':24} {sum(r[1] for r in rows):>10.3f} {sum(r[0] for r in rows):>8.1f}")
    out.write_text("\n".join(lines) + "\n")


def _per_task(
    start: float | None, end: float | None, tasks: int, scale: float = 1e6
) -> float | None:
    """What grew between two readings, per task (seconds as microseconds unless ``scale``
    says otherwise), if both were taken."""
    if start is None or end is None or tasks <= 0:
        return None
    return scale * (end - start) / tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="redis,amqp")
    parser.add_argument("--states", default="memory,redis", help="memory and/or redis")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="few tasks, to check it runs")
    parser.add_argument(
        "--lookahead",
        type=int,
        default=None,
        help="fair_lookahead of the fair worker (default: the worker's own)",
    )
    parser.add_argument(
        "--against",
        metavar="DIR",
        default=None,
        help="also run the fair worker on the celery_fair in DIR (another checkout's src)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=SETTINGS",
        help="also run a fair worker with these fair_* settings (a Python dict literal)",
    )
    parser.add_argument("--tasks", default="noop,10ms", help="noop and/or 10ms")
    parser.add_argument(
        "--store-url",
        default=STATES["redis"],
        help="the Redis of the redis state (default: the local Redis, the broker's on Redis)",
    )
    parser.add_argument(
        "--shards", type=int, default=SHARDS, help="fair_shards of the fair worker (1: none)"
    )
    parser.add_argument(
        "--code",
        metavar="DIR",
        default=None,
        help="every worker on the celery_fair in DIR (a checkout's src), not the installed one",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        default=None,
        help="sample each worker's main process with py-spy into DIR (folded stacks)",
    )
    parser.add_argument(
        "--syscalls",
        metavar="DIR",
        default=None,
        help="count each worker's main process's system calls with perf trace -s into DIR",
    )
    parser.add_argument(
        "--commandstats",
        metavar="DIR",
        default=None,
        help="the local Redis's commands per task over each run (INFO commandstats) into DIR",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the worker's main process on CPU 0, its pool and Redis on CPU 1 (Linux, 2+ CPUs)",
    )
    args = parser.parse_args()
    STATES["redis"] = args.store_url
    profiles = Path(args.profile) if args.profile else None
    traces = Path(args.syscalls) if args.syscalls else None
    commands = Path(args.commandstats) if args.commandstats else None
    for out in (profiles, traces, commands):
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
    base = str(Path(args.code).resolve()) if args.code else None
    if base:
        sys.path.insert(0, base)  # bench_app's publishes too
    variants: list[tuple[str, str | None, str]] = [("fair", base, "")]
    if args.against:
        variants.append((f"fair@{args.against}", str(Path(args.against).resolve()), ""))
    for variant in args.variant:
        name, _, settings = variant.partition("=")
        if not isinstance(ast.literal_eval(settings or "None"), dict):
            parser.error(f"--variant {variant!r}: expected NAME={{'fair_...': value, ...}}")
        variants.append((f"fair+{name}", base, settings))
    sizes = {"noop": 300, "10ms": 100} if args.quick else {"noop": 3000, "10ms": 600}
    sizes = {task: n for task, n in sizes.items() if task in args.tasks.split(",")}
    header = f"{'broker':6} {'state':6} {'task':5} {'plain/s':>9} {'fair/s':>9}"
    print(
        f"{header} {'fair/plain':>10} {'cpu plain':>9} {'cpu fair':>9} "
        f"{'redis plain':>11} {'redis fair':>10} {'pre plain':>9} {'pre fair':>8}  pairs"
    )
    for broker in args.brokers.split(","):
        for state in args.states.split(","):
            for task, n in sizes.items():
                runs: list[tuple[str, str | None, str]] = [("plain", base, ""), *variants]
                got: dict[str, list[Measured]] = {name: [] for name, _, _ in runs}
                for i in range(args.pairs):
                    for name, code, settings in runs if i % 2 == 0 else runs[::-1]:
                        mode = "plain" if name == "plain" else "fair"
                        got[name].append(
                            measure(
                                broker,
                                mode,
                                task,
                                n,
                                args.concurrency,
                                state,
                                args.lookahead,
                                code,
                                settings,
                                args.shards,
                                _profile_path(profiles, broker, state, task, name, i),
                                args.pin,
                                _profile_path(traces, broker, state, task, name, i),
                                _profile_path(commands, broker, state, task, name, i),
                            )
                        )
                plain = [g.rate for g in got["plain"]]
                for name, _, _ in variants:
                    fair = [g.rate for g in got[name]]
                    ratios = [f / p for f, p in zip(fair, plain, strict=True)]
                    label = task if name == "fair" else f"{task} {name}"
                    print(
                        f"{broker:6} {state:6} {label:5} {statistics.median(plain):>9.0f} "
                        f"{statistics.median(fair):>9.0f} {statistics.median(ratios):>10.3f} "
                        f"{_median(got['plain']):>9} {_median(got[name]):>9} "
                        f"{_median(got['plain'], 'redis_us'):>11} "
                        f"{_median(got[name], 'redis_us'):>10} "
                        f"{_median(got['plain'], 'preempted', 2):>9} "
                        f"{_median(got[name], 'preempted', 2):>8}  "
                        f"{' '.join(f'{r:.2f}' for r in ratios)}",
                        flush=True,
                    )


def _median(runs: list[Measured], field: str = "cpu_us", digits: int = 0) -> str:
    """The median of one column over runs, formatted; ``-`` when it was never read."""
    values = [v for r in runs if (v := getattr(r, field)) is not None]
    return f"{statistics.median(values):.{digits}f}" if values else "-"


if __name__ == "__main__":
    main()
