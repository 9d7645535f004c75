"""A git server's background jobs and clone requests, as a Celery app with fair tasks.

The job types are the seed's: clones are foreground work (priority 8: at most 8 at once, and
first in line), repacks, pulls and snapshots are background (priority 4). Clones, repacks and
pulls of one repository never overlap (conflict group ``git``); snapshots run beside anything.
Task bodies sleep for a time that depends on the repository, standing in for real git work.
"""

from __future__ import annotations

import os
import time

from celery import Celery

from celery_fair import fair_task

app = Celery("git_server", set_as_current=False)
app.conf.update(
    broker_url=os.environ.get("GIT_SERVER_BROKER", "memory://localhost/"),
    # The in-memory transport polls its queues; the default (1 s) would delay every receipt.
    broker_transport_options={"polling_interval": 0.01},
    result_backend=os.environ.get("GIT_SERVER_BACKEND", "cache+memory://"),
    task_default_queue=os.environ.get("GIT_SERVER_QUEUE", "git-server"),
    worker_prefetch_multiplier=1,
    result_expires=600,
    broker_connection_retry_on_startup=True,
    fair_pool=os.environ.get("GIT_SERVER_FAIR_POOL", "prefork"),
    # A fleet's shared store (None: the broker's Redis when the broker is Redis) and the
    # workers' Prometheus port (None: no metrics); docker-compose.yml sets both.
    fair_store_url=os.environ.get("GIT_SERVER_STORE") or None,
    fair_metrics_port=int(os.environ["GIT_SERVER_METRICS_PORT"])
    if os.environ.get("GIT_SERVER_METRICS_PORT")
    else None,
)

#: Seconds a clone of each repository takes (a repack takes three times as long).
REPO_SECONDS = {"linux": 0.6, "git": 0.15, "rails": 0.2, "django": 0.15, "react": 0.1, "curl": 0.05}


def work(repo: str, factor: float = 1.0) -> dict[str, float]:
    started = time.time()
    time.sleep(REPO_SECONDS.get(repo, 0.1) * factor)
    return {"started": started, "finished": time.time()}


@fair_task(
    app=app,
    name="git.sync_clone",
    type="sync-clone",
    priority=8,
    max_concurrency=8,
    conflict_group="git",
    default_cost=10,
)
def sync_clone(repo: str) -> dict[str, float]:
    return work(repo)


@fair_task(
    app=app,
    name="git.repack",
    type="repack",
    priority=4,
    max_concurrency=3,
    conflict_group="git",
    default_cost=20,
)
def repack(repo: str) -> dict[str, float]:
    return work(repo, factor=3)


@fair_task(
    app=app,
    name="git.pull",
    type="pull",
    priority=4,
    max_concurrency=3,
    conflict_group="git",
    default_cost=10,
)
def pull(repo: str) -> dict[str, float]:
    return work(repo)


@fair_task(
    app=app, name="git.snapshot", type="snapshot", priority=4, max_concurrency=5, default_cost=5
)
def snapshot(repo: str) -> dict[str, float]:
    return work(repo, factor=0.5)
