"""Real ``celery worker`` processes for the integration tests, and the tools to watch them.

Isolation: every test gets its own queue and record prefix; on Redis, kombu's own keys carry the
prefix too (``global_keyprefix``), so cleanup is a SCAN on the prefix, never FLUSHALL. Workers
are started in their own session and stopped by PID (SIGTERM, then SIGKILL of their process
group, whose id is that PID).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
from celery import Celery
from fairapp import RECORD_URL, Recorder, make_app

from celery_fair.core.lanes import DEFAULT_LANES
from celery_fair.protocol import lane_name
from celery_fair.routing import Shards, shard_name
from spans import max_overlap  # noqa: F401  (the integration tests import it from here)

HERE = Path(__file__).parent
BROKERS = {
    "redis": "redis://127.0.0.1:6379/1",
    "amqp": "amqp://guest:guest@127.0.0.1:5672//",
}
BACKEND = "redis://127.0.0.1:6379/2"
# Redis broker transport options for tests that kill or cut off a worker: its unacked messages
# come back after 4 s, checked every second. Kombu holds a lock while it restores them; a worker
# killed inside that sweep leaves the lock behind for unacked_mutex_expire (300 s by default),
# so it is short here.
FAST_RESTORE = {
    "visibility_timeout": 4,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
    "unacked_mutex_expire": 5,
}
T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    every: float = 0.05,
    show: Callable[[], object] | None = None,
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail saying what was last seen
    (and what ``show`` returns then, for a predicate whose falsy value says little)."""
    deadline = time.monotonic() + timeout
    value = predicate()
    while not value:
        if time.monotonic() > deadline:
            seen = f"\n{show()}" if show is not None else ""
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; last: {value!r}{seen}"
            )
        time.sleep(every)
        value = predicate()
    return value


@dataclass
class Run:
    """One test's private world on one broker."""

    broker: str
    conf: dict[str, Any] = field(default_factory=dict)
    backend: str | None = None

    def __post_init__(self) -> None:
        self.id = uuid.uuid4().hex[:10]
        self.queue = f"cf-{self.id}"
        self.prefix = f"cf-{self.id}"
        self.dead_letter = f"cf-{self.id}-dead"
        self.conf.setdefault("fair_dead_letter_queue", self.dead_letter)
        self.conf.setdefault("fair_store_prefix", self.prefix)
        self.url = BROKERS[self.broker]
        if self.broker == "redis":
            options = dict(self.conf.get("broker_transport_options", {}))
            options.setdefault("global_keyprefix", f"{self.prefix}:")
            self.conf["broker_transport_options"] = options
        if self.backend is not None:  # results under the run's prefix too: cleanup is a SCAN
            options = dict(self.conf.get("result_backend_transport_options", {}))
            options.setdefault("global_keyprefix", f"{self.prefix}:")
            self.conf["result_backend_transport_options"] = options
        self.recorder = Recorder(self.prefix)
        self.extra_queues: list[str] = []  # other queues a test uses, deleted with its own
        self._app: Celery | None = None

    @property
    def app(self) -> Celery:
        """The client side of the same app the workers run."""
        if self._app is None:
            self._app = make_app(
                self.url, self.queue, self.prefix, backend=self.backend, conf=self.conf
            )
        return self._app

    def send(self, name: str, *args: Any, headers: dict | None = None, **options: Any) -> Any:
        return self.app.send_task(name, args, headers=headers, queue=self.queue, **options)

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(HERE),
            "FAIRAPP_BROKER": self.url,
            "FAIRAPP_QUEUE": self.queue,
            "FAIRAPP_PREFIX": self.prefix,
            "FAIRAPP_BACKEND": self.backend or "",
            "FAIRAPP_CONF": json.dumps(self.conf),
        }

    def cleanup(self) -> None:
        self.recorder.clear()
        if self.broker == "redis":
            client = redis.Redis.from_url(self.url)
            for pattern in (f"{self.prefix}:*", f"{{{self.prefix}}}:*"):  # kombu's, the store's
                for key in client.scan_iter(match=pattern, count=1000):
                    client.delete(key)
        else:
            count = Shards.of(self.app).count
            queues = [self.queue, *self.extra_queues]
            shards = [shard_name(q, i) for q in queues for i in range(count)]
            lanes = self.conf.get("fair_lanes", DEFAULT_LANES)
            shards += [lane_name(q, j) for q in queues for j in range(lanes)]
            with self.app.connection_for_write() as conn:
                channel = conn.default_channel
                for queue in (*queues, *shards, self.dead_letter):
                    try:
                        channel.queue_delete(queue)
                    except Exception:  # best effort: it may not exist
                        channel = conn.channel()
        if self.backend:
            client = redis.Redis.from_url(self.backend)
            for key in client.scan_iter(match=f"{self.prefix}:*", count=1000):
                client.delete(key)
        if self._app is not None:
            self._app.close()


class Worker:
    """A ``celery -A fairapp worker`` subprocess (``launcher``: a module to run instead)."""

    def __init__(
        self,
        run: Run,
        *,
        pool: str = "fair",
        concurrency: int = 2,
        name: str | None = None,
        args: tuple[str, ...] = (),
        log_dir: Path,
        env: dict[str, str] | None = None,
        launcher: tuple[str, ...] = ("celery",),
        queues: tuple[str, ...] = (),
    ) -> None:
        self.run = run
        self.name = name or f"w{uuid.uuid4().hex[:6]}"
        self.log_path = log_dir / f"{self.name}.log"
        self.command = [
            sys.executable,
            "-m",
            *launcher,
            "-A",
            "fairapp",
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-Q",
            ",".join(queues or (run.queue,)),
            "-n",
            f"{self.name}@%h",
            "--without-mingle",
            "--without-gossip",
            "-l",
            "INFO",
            *args,
        ]
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_env = env or {}

    def start(self, timeout: float = 30) -> Worker:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command,
                cwd=HERE,
                env={**self.run.env(), **self.extra_env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self._ready, timeout, f"worker {self.name} to be ready (log {self.log_path})")
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"worker {self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}"
            )
        return " ready." in self.log()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL the worker and its pool processes (its process group, id = its PID)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 20) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        else:
            with contextlib.suppress(ProcessLookupError):  # pool children left behind, if any
                os.killpg(self.pid, signal.SIGKILL)


def later_queue(run: Run) -> str:
    """A queue of ``run``'s own that no worker reads until a test adds it (``add_consumer``),
    deleted with the run. Its own: on RabbitMQ every run shares one vhost, and a queue named
    alike in two tests running at once (``"later"``, as it was) let one test's worker take the
    other's jobs (CI saw a job never received, twice)."""
    name = f"{run.queue}-later"
    if name not in run.extra_queues:
        run.extra_queues.append(name)
    return name


def node(worker: Worker) -> str:
    """``worker``'s node name, as remote control and the logs name it."""
    return f"{worker.name}@{socket.gethostname()}"


def gate_stats(run: Run, worker: Worker) -> dict[str, Any]:
    """The gate's counters, as ``celery inspect stats`` reports them (``pool`` section)."""
    name = node(worker)

    def answered() -> dict[str, Any] | None:
        # (a loaded host can miss the 1 s reply window: no answer is not an empty gate)
        stats = run.app.control.inspect(destination=[name], timeout=1).stats() or {}
        return stats.get(name)

    return dict(wait_until(answered, 30, f"{name} to answer inspect stats").get("pool", {}))


#: The gate's counts of what is inside it, each zero when the worker is idle.
INSIDE = ("fair-held", "fair-reserved", "fair-running", "plain-running", "pool-in-line")


def wait_until_gate_idle(run: Run, worker: Worker, timeout: float = 20) -> dict[str, Any]:
    """Wait until the gate counts nothing inside it and its slots are whole again (the pool's
    size); return its statistics."""

    def idle() -> dict[str, Any] | None:
        stats = gate_stats(run, worker)
        whole = stats.get("fair-slots") == stats.get("max-concurrency", -1)
        return stats if whole and all(stats.get(k) == 0 for k in INSIDE) else None

    return wait_until(idle, timeout, "the gate to be idle", show=lambda: gate_stats(run, worker))


def wait_until_recorded_by_the_broker(run: Run, count: int, timeout: float = 30) -> None:
    """On the Redis broker, wait until none of the run's ``count`` messages is on its way from
    Redis to a worker: the queue is empty, and each message is unacked (Kombu's record of it,
    which a dead worker's messages come back from) or done. Kombu pops a message (BRPOP) before
    it records it, so a worker killed in between loses it, with or without celery-fair; a test
    that kills a worker and counts every job waits for this first. Nothing to wait for on
    RabbitMQ, which tracks every delivery itself."""
    if run.broker != "redis":
        return
    client = redis.Redis.from_url(run.url)

    def recorded() -> bool:
        queued = client.llen(f"{run.prefix}:{run.queue}")
        unacked = client.hlen(f"{run.prefix}:unacked")
        return queued == 0 and unacked + len(run.recorder.done_counts()) >= count

    try:
        wait_until(recorded, timeout, f"all {count} messages to be recorded by Kombu", every=0.01)
    finally:
        client.close()


def producers_at_once(run: Run, code: str, n: int, lead: float = 3.0) -> list[str]:
    """Run ``code`` in ``n`` producer processes of the run's app that act at the same moment
    (``sys.argv[1]``: when, ``lead`` seconds from now, long after each has started); what each
    printed, once all exited 0."""
    at = time.time() + lead
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, repr(at)],
            cwd=HERE,
            env=run.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    return [out for out, _ in outputs]


def queue_length(run: Run, queue: str) -> int:
    """Messages ready on ``queue`` in the broker (0 if it was never declared)."""
    if run.broker == "redis":  # a list under the run's key prefix (Kombu's global_keyprefix)
        client = redis.Redis.from_url(run.url)
        try:
            return int(client.llen(f"{run.prefix}:{queue}"))
        finally:
            client.close()
    with run.app.connection_for_write() as conn:
        try:
            _, count, _ = conn.default_channel.queue_declare(queue, passive=True)
        except conn.channel_errors:  # RabbitMQ: 404, no such queue
            return 0
    return int(count)


def cut_broker_connections(worker: Worker) -> int:
    """Close the worker's broker connections from the broker's side; return how many."""
    port = 6379 if worker.run.broker == "redis" else 5672
    listing = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True, check=True).stdout
    local_ports = set()
    for line in listing.splitlines():
        if f"pid={worker.pid}," in line:
            parts = line.split()
            local, peer = parts[3], parts[4]
            if peer.endswith(f":{port}"):
                local_ports.add(local.rsplit(":", 1)[1])
    if worker.run.broker == "redis":
        client = redis.Redis.from_url(RECORD_URL)
        killed = 0
        for local in local_ports:
            try:
                client.client_kill(f"127.0.0.1:{local}")
                killed += 1
            except redis.ResponseError:  # a short-lived connection already gone
                pass
        return killed
    rows = subprocess.run(
        ["rabbitmqctl", "-q", "list_connections", "pid", "name"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    closed = 0
    for row in rows:
        pid, _, name = row.partition("\t")
        if any(name.startswith(f"127.0.0.1:{p} ") for p in local_ports):
            subprocess.run(["rabbitmqctl", "-q", "close_connection", pid, "test"], check=True)
            closed += 1
    return closed


def check_services() -> None:
    """Fail (never skip) when Redis or RabbitMQ is missing: .ci/run starts them."""
    redis.Redis.from_url(RECORD_URL).ping()
    app = Celery(broker=BROKERS["amqp"], set_as_current=False)
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
    finally:
        app.close()


def intervals(events: list[dict], kind: str | None = None) -> dict[str, tuple[float, float]]:
    """``tag -> (start, end)`` from recorded events (only tags that ended)."""
    starts: dict[str, float] = {}
    out: dict[str, tuple[float, float]] = {}
    for e in events:
        if kind is not None and e.get("type") != kind:
            continue
        if e["event"] == "start":
            starts[e["tag"]] = e["t"]
        elif e["event"] == "end" and e["tag"] in starts:
            out[e["tag"]] = (starts[e["tag"]], e["t"])
    return out
