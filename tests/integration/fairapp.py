"""The Celery app the integration tests run in real workers.

The worker process builds it from environment variables (``FAIRAPP_*``); the test process
builds the same app with ``make_app`` to publish. Every task records its start and end in
Redis under the run's own prefix, so tests read what happened instead of guessing from time.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time

import redis
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

from celery_fair import fair_task

RECORD_URL = "redis://127.0.0.1:6379/0"


class Recorder:
    """Appends events to ``{prefix}:events`` and counts completions in ``{prefix}:done``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.redis = redis.Redis.from_url(RECORD_URL)

    def record(self, event: str, tag: str, **extra: object) -> None:
        entry = {
            "event": event,
            "tag": tag,
            "t": time.time(),
            "pid": os.getpid(),
            "ppid": os.getppid(),  # the worker, under prefork
            **extra,
        }
        self.redis.rpush(f"{self.prefix}:events", json.dumps(entry))

    def done(self, tag: str) -> None:
        self.redis.hincrby(f"{self.prefix}:done", tag, 1)

    def events(self) -> list[dict]:
        return [json.loads(e) for e in self.redis.lrange(f"{self.prefix}:events", 0, -1)]

    def done_counts(self) -> dict[str, int]:
        raw = self.redis.hgetall(f"{self.prefix}:done")
        return {k.decode(): int(v) for k, v in raw.items()}

    def release(self, tag: str) -> None:
        """End the running job ``tag`` now (a job of ``LONG`` seconds or more waits for this)."""
        self.redis.rpush(f"{self.prefix}:release:{tag}", 1)

    def wait_released(self, tag: str, seconds: float) -> None:
        """Sleep ``seconds``, or less if the test releases ``tag`` first (looked for every
        50 ms: a blocking pop would meet the socket timeout a worker's clients may carry)."""
        deadline = time.monotonic() + seconds
        key = f"{self.prefix}:release:{tag}"
        while time.monotonic() < deadline and not self.redis.lpop(key):
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def clear(self) -> None:
        self.redis.delete(f"{self.prefix}:events", f"{self.prefix}:done", f"{self.prefix}:tries")
        for key in self.redis.scan_iter(match=f"{self.prefix}:release:*"):
            self.redis.delete(key)


#: A job at least this long can be ended early by the test (``Recorder.release``): a test that
#: needs a job running while it looks gives it a minute, and ends it when it has looked.
LONG = 20.0


def make_app(
    broker: str,
    queue: str,
    prefix: str,
    *,
    backend: str | None = None,
    conf: dict | None = None,
) -> Celery:
    app = Celery("fairapp", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(
        {
            "task_default_queue": queue,
            "worker_prefetch_multiplier": 1,
            "broker_connection_retry_on_startup": True,
            "task_create_missing_queues": True,
            # Remote control and events on exchanges of the run's own, so that tests running
            # side by side (pytest-xdist) on RabbitMQ's one vhost never hear each other's
            # workers (Redis keeps them apart by the run's global_keyprefix as well).
            "control_exchange": f"{queue}-control",
            "event_exchange": f"{queue}-events",
            # Results under the run's prefix too, so that a run's cleanup deletes its own
            # results only, never those of a run going on beside it.
            "result_backend_transport_options": {"global_keyprefix": f"{prefix}:"},
            **(conf or {}),
        }
    )
    rec = Recorder(prefix)

    # FAIRAPP_SLEEP_CAP: a worker on which no job lasts longer (a test's second worker).
    cap = float(os.environ.get("FAIRAPP_SLEEP_CAP", "inf"))

    def run(tag: str, seconds: float, **extra: object) -> str:
        rec.record("start", tag, **extra)
        if min(seconds, cap) >= LONG:
            rec.wait_released(tag, min(seconds, cap))
        else:
            time.sleep(min(seconds, cap))
        rec.record("end", tag, **extra)
        rec.done(tag)
        return tag

    @fair_task(
        app=app,
        name="fairapp.clone",
        type="clone",
        priority=8,
        conflict_group="git",
        default_cost=1,
    )
    def clone(tag: str, seconds: float = 0.01) -> str:
        return run(tag, seconds, type="clone")

    # Charged what it costs from its first job on (a default of 1 s would charge a key's
    # first jobs 10 times what later ones are charged, until the estimate is learned).
    @fair_task(app=app, name="fairapp.even", type="even", priority=8, default_cost=0.1)
    def even(tag: str, seconds: float = 0.1) -> str:
        return run(tag, seconds, type="even")

    @fair_task(
        app=app,
        name="fairapp.maintenance",
        type="maintenance",
        priority=2,
        conflict_group="git",
        default_cost=1,
    )
    def maintenance(tag: str, seconds: float = 0.01) -> str:
        return run(tag, seconds, type="maintenance")

    @fair_task(
        app=app,
        name="fairapp.rescan",
        type="rescan",
        priority=2,
        default_cost=1,
        aging={"grace": 1.0, "interval": 0.5, "max_effective_priority": 8, "urgent_threshold": 8},
    )
    def rescan(tag: str, seconds: float = 0.01) -> str:  # the same tier as maintenance; ages
        return run(tag, seconds, type="rescan")

    # A type whose jobs start at most 5 a second across the fleet, all keys together.
    @fair_task(app=app, name="fairapp.export", type="export", priority=8, rate="5/s", burst=5)
    def export(tag: str, seconds: float = 0.01) -> str:
        return run(tag, seconds, type="export")

    @fair_task(
        app=app, name="fairapp.late", type="late", priority=8, default_cost=1, acks_late=True
    )
    def late(tag: str, seconds: float = 0.01) -> str:
        return run(tag, seconds, type="late")

    @fair_task(
        app=app,
        name="fairapp.repack",
        type="repack",
        priority=4,
        max_concurrency=2,
        conflict_group="git",
        default_cost=1,
    )
    def repack(tag: str, seconds: float = 0.01) -> str:
        return run(tag, seconds, type="repack")

    @fair_task(app=app, name="fairapp.snapshot", type="snapshot", priority=4, max_concurrency=2)
    def snapshot(tag: str, seconds: float = 0.01) -> str:
        return run(tag, seconds, type="snapshot")

    @fair_task(
        app=app,
        name="fairapp.locked",
        type="locked",
        priority=8,
        max_concurrency=3,
        conflict_group="git",
        default_cost=1,
        acks_late=True,
        bind=True,
    )
    def locked(self, tag: str, seconds: float = 0.01) -> str:
        return run(tag, seconds, type="locked", token=self.request.get("fair_token"))

    @fair_task(
        app=app,
        name="fairapp.fenced",
        type="locked",
        priority=8,
        max_concurrency=3,
        conflict_group="git",
        default_cost=1,
        bind=True,
    )
    def fenced(self, tag: str, repo: str, db_path: str, seconds: float = 0.01) -> str:
        """docs/store.md's fencing recipe, verbatim, on a SQLite file: records whether the
        write was accepted (its token above the repository's fence) or refused."""
        token = self.request.get("fair_token")
        db = sqlite3.connect(db_path, timeout=30)
        try:
            with db:
                db.execute(
                    "CREATE TABLE IF NOT EXISTS repos (name TEXT PRIMARY KEY, fence INTEGER)"
                )
                db.execute("INSERT OR IGNORE INTO repos VALUES (?, 0)", (repo,))
                written = db.execute(
                    "UPDATE repos SET fence = :t WHERE name = :r AND fence < :t",
                    {"t": token, "r": repo},
                ).rowcount
        finally:
            db.close()
        return run(tag, seconds, type="fenced", token=token, written=bool(written))

    @app.task(name="fairapp.plain", shared=False)
    def plain(tag: str, seconds: float = 0.01) -> str:
        return run(tag, seconds, type="plain")

    @fair_task(app=app, name="fairapp.add", type="clone")
    def add(x: int, y: int) -> int:
        rec.record("start", f"add:{x}+{y}")
        rec.done(f"add:{x}+{y}")
        return x + y

    @fair_task(app=app, name="fairapp.boom", type="clone")
    def boom(tag: str) -> str:
        rec.record("start", tag)
        raise ValueError(f"boom: {tag}")

    @fair_task(app=app, name="fairapp.tsum", type="clone")
    def tsum(values: list[int]) -> int:
        rec.done(f"tsum:{sum(values)}")
        return sum(values)

    @fair_task(app=app, name="fairapp.flaky", type="clone", bind=True, max_retries=3)
    def flaky(self, tag: str) -> str:
        tries = rec.redis.hincrby(f"{prefix}:tries", tag, 1)
        rec.record("start", tag, attempt=tries, key=getattr(self.request, "fairness_key", None))
        if tries < 2:
            raise self.retry(countdown=1)
        rec.done(tag)
        return tag

    @fair_task(app=app, name="fairapp.counted", type="clone", bind=True)
    def counted(self, tag: str, seconds: float = 0.01) -> str:
        """A clone that records how many times its message went back to the broker."""
        trips = getattr(self.request, "fair_republished", None) or 0
        return run(tag, seconds, type="clone", republished=trips)

    @app.task(name="fairapp.replaced", shared=False, bind=True)
    def replaced(self, tag: str, depth: int, seconds: float = 0.01) -> str:
        """Replaces itself ``depth`` times (each replacement keeps the task id), then runs."""
        rec.record("start", f"{tag}@{depth}", nesting=self.request.replaced_task_nesting)
        if depth:
            raise self.replace(replaced.s(tag, depth - 1, seconds))
        return run(tag, seconds, type="plain")

    @fair_task(app=app, name="fairapp.fair_replaced", type="clone", bind=True)
    def fair_replaced(self, tag: str, depth: int, seconds: float = 0.01) -> str:
        """The same as a fair task: its replacements are fair jobs with the same task id."""
        key = getattr(self.request, "fairness_key", None)
        rec.record("start", f"{tag}@{depth}", nesting=self.request.replaced_task_nesting, key=key)
        if depth:
            raise self.replace(fair_replaced.s(tag, depth - 1, seconds))
        return run(tag, seconds, type="clone")

    @fair_task(app=app, name="fairapp.located", type="clone", bind=True)
    def located(self, tag: str, retries: int = 0, seconds: float = 0.01) -> str:
        """Records the queue it came from, then retries itself ``retries`` times."""
        info = self.request.delivery_info or {}
        key = getattr(self.request, "fairness_key", None)
        rec.record("start", tag, queue=info.get("routing_key"), key=key, retry=self.request.retries)
        if self.request.retries < retries:
            raise self.retry(countdown=0.2)
        time.sleep(seconds)
        rec.record("end", tag)
        rec.done(tag)
        return tag

    @fair_task(app=app, name="fairapp.limited", type="clone", rate_limit="2/s")
    def limited(tag: str) -> str:
        return run(tag, 0.0, type="limited")

    @fair_task(app=app, name="fairapp.slow_soft", type="clone", soft_time_limit=0.5)
    def slow_soft(tag: str) -> str:
        rec.record("start", tag)
        try:
            time.sleep(5)
        except SoftTimeLimitExceeded:
            rec.done(f"{tag}:soft-limit")
            return "soft"
        return "no limit"

    @fair_task(app=app, name="fairapp.slow_hard", type="clone", time_limit=1)
    def slow_hard(tag: str) -> str:
        rec.record("start", tag)
        time.sleep(5)
        rec.done(tag)
        return "no limit"

    return app


if "FAIRAPP_BROKER" in os.environ:
    app = make_app(
        os.environ["FAIRAPP_BROKER"],
        os.environ["FAIRAPP_QUEUE"],
        os.environ["FAIRAPP_PREFIX"],
        backend=os.environ.get("FAIRAPP_BACKEND") or None,
        conf=json.loads(os.environ.get("FAIRAPP_CONF", "{}")),
    )
