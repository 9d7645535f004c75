"""The app worker_bench.py runs: a no-op and a 10 ms fair task that count themselves."""

from __future__ import annotations

import ast
import os
import time

import redis
from celery import Celery

from celery_fair import fair_task

# BENCH_LOOKAHEAD "" = the worker's default (adaptive with a shared store, 0 alone)
LOOKAHEAD = int(os.environ["BENCH_LOOKAHEAD"]) if os.environ.get("BENCH_LOOKAHEAD") else None
app = Celery("bench", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/4"),
    task_default_queue=os.environ.get("BENCH_QUEUE", "bench"),
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    # "memory": this worker's state alone; a redis:// URL: the shared store (the default on a
    # Redis broker is the broker's Redis).
    fair_store_url=os.environ.get("BENCH_STORE") or None,
    fair_store_prefix=f"bench-{os.environ.get('BENCH_QUEUE', 'bench')}",
    fair_lookahead=LOOKAHEAD,
    # plain Celery consumes no shards: the plain runs publish with 1 (worker_bench.py)
    fair_shards=int(os.environ.get("BENCH_SHARDS") or 8),
)
# worker_bench.py --variant: more fair_* settings, a Python dict literal
app.conf.update(ast.literal_eval(os.environ.get("BENCH_SETTINGS") or "{}"))
KEY = os.environ.get("BENCH_KEY", "bench")
RECORD = redis.Redis.from_url("redis://127.0.0.1:6379/0")


def _count() -> None:
    now = time.time()
    pipe = RECORD.pipeline()
    pipe.set(f"{KEY}:first", now, nx=True)
    pipe.set(f"{KEY}:last", now)
    pipe.incr(f"{KEY}:count")
    pipe.execute()


@fair_task(app=app, name="bench.noop", type="bench", priority=8, conflict_group="repo")
def noop() -> None:
    _count()


@fair_task(app=app, name="bench.sleep10", type="bench")
def sleep10() -> None:
    time.sleep(0.01)
    _count()
