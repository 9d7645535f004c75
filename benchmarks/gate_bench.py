"""The gate's own CPU per task, without Celery: the real ``Gate`` on a stand-in consumer.

Run by hand; results go to docs/benchmarks.md with the command:

    python benchmarks/gate_bench.py                          # both states, 5 rounds
    python benchmarks/gate_bench.py --states redis --held 12 # a gate that holds few messages
    python benchmarks/gate_bench.py --against /tmp/base/src  # two versions, interleaved
    python benchmarks/gate_bench.py --profile redis          # where it goes (cProfile)

``worker_bench.py`` measures what users see, a real worker against plain Celery, but on this
host its figures move by several percent from one run to the next and mix the gate's cost with
everything else the worker's main process does. This one isolates the gate: it drives the same
``Gate``, ``Engine``, core, ``RedisStore`` and ``StoreLink`` a worker runs, through the same
entry points (``on_request``, the loop's tick and the store socket's reply, the pool's
callbacks), with stand-ins for what Celery would do around them: a consumer whose event loop
is a plain ``select``, and a pool of two processes whose jobs end the moment they are handed
over. Every ended job brings the next message, so the gate keeps holding ``--held`` messages
of ten clients and fifty job ids, like the worker benchmark's burst. The figure is the process's
CPU time per task over ``--tasks`` tasks after a warm-up, the median of ``--rounds`` runs, each in
a fresh process.

In a real worker the same code costs more per task (caches shared with Celery and the other
processes): use this to compare versions of the gate and to see where its time goes, and
``worker_bench.py`` for the ratio against plain Celery.

``--against DIR`` runs a second version of ``celery_fair`` (another checkout's ``src``) in
alternating rounds and prints the median of the per-round ratios (this checkout over DIR).
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

URL = "redis://127.0.0.1:6379/0"
CLIENTS = 10
JOB_IDS = 50


def run(
    state: str, tasks: int, held: int, profile: str | None, metrics: bool = False
) -> tuple[float, float, float]:
    """Drive one gate through ``tasks`` tasks; returns its CPU microseconds per task, and its
    store calls and reserved jobs given back per task."""
    import redis
    from celery.concurrency.thread import TaskPool

    from celery_fair.core import JobType
    from celery_fair.settings import FairSettings
    from celery_fair.store.redis import RedisStore
    from celery_fair.worker.gate import Gate

    class Pool(TaskPool):  # a pool the gate gives a reserve to (prefork or threads)
        num_processes = 2
        limit = 2

    class Hub:  # the part of Kombu's hub the gate and its store link use
        def __init__(self) -> None:
            self.readers: dict[int, Any] = {}
            self.on_tick: set[Any] = set()
            self.soon: list[Any] = []

        def add_reader(self, fd: int, callback: Any) -> None:
            self.readers[fd] = callback

        def remove_reader(self, fd: int) -> None:
            self.readers.pop(fd, None)

        def call_soon(self, fn: Any, *args: Any) -> None:
            self.soon.append((fn, args))

        def call_later(self, seconds: float, fn: Any, *args: Any) -> Any:
            return Timer()

    class Timer:
        def cancel(self) -> None:
            pass

    class QoS:
        def increment_eventually(self, n: int) -> None:
            pass

        def decrement_eventually(self, n: int) -> None:
            pass

    class Connection:  # a broker without an ack timeout: held messages are never refreshed
        class transport:
            driver_type = "memory"

    class App:
        conf = None

        def connection_for_read(self) -> Connection:
            return Connection()

    class Consumer:
        app = App()
        qos = QoS()
        pool = object.__new__(Pool)
        hub = None
        timer = None

    class Task:
        @classmethod
        def job_type_name(cls) -> str:
            return "bench"

    class Message:
        acknowledged = False

        def ack(self) -> None:
            self.acknowledged = True

    class Request:  # what the gate reads of Celery's Request
        task = Task()
        name = "bench.noop"
        expires = None
        _eventer = None  # task events off, as by default

        def __init__(self, i: int) -> None:
            self.id = str(uuid.uuid4())
            self._message = Message()
            self.request_dict = {
                "fairness_key": f"client{i % CLIENTS}",
                "job_id": f"r{i % JOB_IDS}",
                "retries": 0,
            }

        @property
        def acknowledged(self) -> bool:
            return self._message.acknowledged

        def on_accepted(self, pid: int, time_accepted: float) -> None:
            pass

        def on_success(self, result: Any) -> None:
            pass

        def on_failure(self, einfo: Any) -> None:
            pass

    handed: list[tuple[Request, dict[str, Any]]] = []

    def process_task(req: Request) -> None:  # Celery's path to the pool, down to apply_async
        options = {
            "correlation_id": req.id,
            "accept_callback": req.on_accepted,
            "callback": req.on_success,
            "error_callback": req.on_failure,
        }
        handed.append((req, gate.wrap_callbacks(("task", req.id, req.request_dict), options)))

    store = client = None
    prefix = f"gate-bench-{uuid.uuid4().hex[:8]}"
    if state == "redis":
        client = redis.Redis.from_url(URL)
        store = RedisStore(client, prefix=prefix)
    types = {"bench": JobType("bench", priority=8, conflict_group="repo")}
    consumer = Consumer()
    extra: dict[str, Any] = {}
    if metrics:  # the Prometheus observer on top of the counters (only this checkout has it)
        from celery_fair.metrics import WorkerMetrics

        extra["observer"] = WorkerMetrics(look=lambda: gate.look())
    # The factory a worker uses (a checkout from before it existed builds its parts in Gate).
    try:
        from celery_fair.worker.bootstep import gate_for_worker as build
    except ImportError:
        build = getattr(Gate, "for_worker", Gate)
    gate = build(consumer, FairSettings.from_mapping({}), types, process_task, store=store, **extra)
    gate.on_connected()
    hub = Hub() if store is not None else None
    if hub is not None:
        gate.start_link(hub)
    sent = 0

    def deliver() -> None:
        nonlocal sent
        gate.on_request(Request(sent))
        sent += 1

    def loop(n: int) -> None:
        for _ in range(held - len(gate.held)):
            deliver()
        finished = 0
        while finished < n:
            if hub is not None:  # one turn of the event loop
                for tick in list(hub.on_tick):
                    tick()
                ready = select.select(list(hub.readers), [], [], 0 if handed else 1)[0]
                for fd in ready:
                    hub.readers[fd]()
                while hub.soon:
                    fn, args = hub.soon.pop(0)
                    fn(*args)
            if handed:  # a pool process takes the oldest job and ends it at once
                req, options = handed.pop(0)
                req._message.ack()
                options["accept_callback"](1, time.monotonic())
                options["callback"](None)
                finished += 1
                deliver()

    try:
        loop(min(2000, tasks))  # warm up: estimates learned, reserve sized
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        start = time.process_time()
        counts = _counts(gate)
        loop(tasks)
        used = time.process_time() - start
        calls, given = (_counts(gate)[k] - counts[k] for k in ("calls", "given_back"))
        if profiler is not None:
            import pstats

            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(40)
    finally:
        if client is not None:
            for key in client.scan_iter(match=f"{{{prefix}}}:*"):
                client.delete(key)
    return 1e6 * used / tasks, calls / tasks, given / tasks


def _counts(gate: Any) -> dict[str, int]:
    """The engine's counters: an observer's since the observer came, the engine's before."""
    counters = getattr(gate, "counters", None)
    return dict(counters.counts if counters is not None else gate.engine.counts)


def child(
    args: argparse.Namespace, state: str, code: str | None, metrics: bool = False
) -> tuple[float, ...]:
    env = dict(os.environ)
    if code:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [code, env.get("PYTHONPATH")]))
    command = [sys.executable, __file__, "--child", state]
    command += ["--tasks", str(args.tasks), "--held", str(args.held)]
    command += ["--metrics"] if metrics else []
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return tuple(float(x) for x in out.stdout.split()[-3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--states", default="memory,redis", help="memory and/or redis")
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--held", type=int, default=200, help="messages the gate holds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", metavar="DIR", help="another celery_fair's src folder")
    parser.add_argument("--quick", action="store_true", help="few tasks, to check it runs")
    parser.add_argument("--profile", metavar="STATE", help="one run under cProfile")
    parser.add_argument("--child", metavar="STATE", help=argparse.SUPPRESS)
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="also run this checkout with the Prometheus observer, in the same rounds",
    )
    args = parser.parse_args()
    if args.quick:
        args.tasks, args.rounds = 500, 1
    if args.child or args.profile:
        state = args.child or args.profile
        got = run(state, args.tasks, args.held, args.profile, args.metrics)
        print(" ".join(f"{x:.4f}" for x in got))
        return
    print(f"per task, medians of {args.rounds} rounds (held={args.held}):")
    for state in args.states.split(","):
        mine: list[tuple[float, ...]] = []
        theirs: list[tuple[float, ...]] = []
        watched: list[tuple[float, ...]] = []
        for _ in range(args.rounds):
            mine.append(child(args, state, None))
            if args.against:
                theirs.append(child(args, state, args.against))
            if args.metrics:
                watched.append(child(args, state, None, metrics=True))
        print(f"{state:7s} this checkout {_medians(mine)}")
        if args.metrics:
            ratios = [a[0] / b[0] for a, b in zip(watched, mine, strict=True)]
            print(f"{state:7s} with metrics  {_medians(watched)}")
            extra = statistics.median(a[0] - b[0] for a, b in zip(watched, mine, strict=True))
            ratio = statistics.median(ratios)
            print(f"{state:7s} metrics: +{extra:.1f} us a task, ratio {ratio:.3f}")
        if args.against:
            ratios = [a[0] / b[0] for a, b in zip(mine, theirs, strict=True)]
            print(f"{state:7s} {args.against} {_medians(theirs)}")
            print(
                f"{state:7s} CPU ratio {statistics.median(ratios):.3f}"
                f" ({' '.join(f'{r:.2f}' for r in ratios)})"
            )


def _medians(runs: list[tuple[float, ...]]) -> str:
    cpu, calls, given = (statistics.median(column) for column in zip(*runs, strict=True))
    return f"{cpu:7.1f} us of CPU  {calls:.3f} store calls  {given:.3f} given back"


if __name__ == "__main__":
    main()
