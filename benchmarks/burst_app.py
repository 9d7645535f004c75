"""The app burst_bench.py runs: one fair task that records when each job starts and ends."""

from __future__ import annotations

import ast
import os
import time

import redis
from celery import Celery

from celery_fair import fair_task

app = Celery("burst", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("BURST_BROKER", "redis://127.0.0.1:6379/4"),
    task_default_queue=os.environ.get("BURST_QUEUE", "burst"),
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    fair_store_prefix=f"burst-{os.environ.get('BURST_QUEUE', 'burst')}",
    # plain Celery consumes no shards: its runs publish with 1
    fair_shards=int(os.environ.get("BURST_SHARDS") or 8),
    # None: the broker's Redis on a Redis broker, alone on RabbitMQ (e2e_bench.py sets one)
    fair_store_url=os.environ.get("BURST_STORE") or None,
)
# --settings of burst_bench.py: more fair_* settings, a Python dict literal
app.conf.update(ast.literal_eval(os.environ.get("BURST_SETTINGS") or "{}"))
KEY = os.environ.get("BURST_KEY", "burst")
RECORD = redis.Redis.from_url("redis://127.0.0.1:6379/0")


@fair_task(app=app, name="burst.job", type="burst", priority=8, bind=True)
def job(self, client: str, seconds: float) -> None:  # type: ignore[no-untyped-def]
    """``client``'s job: its start time goes in the sorted set ``<KEY>:start:<client>`` and
    its end in ``<KEY>:end:<client>``, each under its task id."""
    RECORD.zadd(f"{KEY}:start:{client}", {self.request.id: time.time()})
    time.sleep(seconds)
    RECORD.zadd(f"{KEY}:end:{client}", {self.request.id: time.time()})
