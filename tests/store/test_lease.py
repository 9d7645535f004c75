"""A process holding slots and conflicts is killed with SIGKILL: another process reclaims them
within the lease, and the dead holder's late completion changes nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import redis
from harness import wait_until
from shared_redis import REDIS_URL, clean
from test_contract import ask

from celery_fair.core import CostLifecycle
from celery_fair.store import Done, RedisStore, Verdict, conflict_field

LEASE = 1.0

HOLDER = """
import sys, threading
import redis
from celery_fair.core import CostLifecycle
from celery_fair.store import Ask, RedisStore, conflict_field, estimate_field
store = RedisStore(redis.Redis.from_url(sys.argv[1]), sys.argv[2], lease=float(sys.argv[3]),
                   lifecycle=CostLifecycle.never())
asks = [Ask(uid, "clone", 8, None, 2, conflict_field("git", job_id),
            estimate_field("clone", job_id), "k", None, 1.0)
        for uid, job_id in (("a", "linux"), ("b", "git"))]
print(" ".join(str(g.token) for g in store.admit("holder", asks).grants), flush=True)
threading.Event().wait()  # hold them until killed
"""


def test_sigkilled_holder_loses_its_slots_within_the_lease_and_its_late_finish_is_stale(
    redis_client,
):
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, REDIS_URL, prefix, str(LEASE)],
        stdout=subprocess.PIPE,
        text=True,
    )
    stores: list[RedisStore] = []
    try:
        tokens = [int(t) for t in holder.stdout.readline().split()]
        assert len(tokens) == 2
        other = RedisStore(
            redis.Redis.from_url(REDIS_URL), prefix, lease=LEASE, lifecycle=CostLifecycle.never()
        )
        stores.append(other)
        # While the holder lives, its type cap of 2 and both conflicts are taken.
        assert other.admit("other", [ask("c", type_cap=2)]).grants[0].verdict is Verdict.TYPE_CAP
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        killed = time.monotonic()
        linux, git = conflict_field("git", "linux"), conflict_field("git", "git")

        def reclaimed():
            view = other.heartbeat("other", [linux, git], [])
            return view if view.types == {} and not any(view.held.values()) else None

        wait_until(reclaimed, 10, "the holder's lease to expire", every=0.05)
        assert time.monotonic() - killed < LEASE + 1.0
        [c] = other.admit("other", [ask("c", job_id="linux", type_cap=2)]).grants
        assert c.verdict is Verdict.ADMITTED
        # The holder's completion arrives late (as from a process that only paused): stale.
        late = RedisStore(
            redis.Redis.from_url(REDIS_URL), prefix, lease=LEASE, lifecycle=CostLifecycle.never()
        )
        stores.append(late)
        done = late.finish("holder", [Done("a", tokens[0], 9.0), Done("b", tokens[1], 9.0)])
        assert [d.applied for d in done] == [False, False]
        assert other.estimate("clone", "linux", 1.0) == 1.0
        view = other.heartbeat("other", [linux], [])
        assert view.held[linux]
        assert view.types == {"clone": 1}
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()
        for store in stores:
            store.close()
            store.client.close()
        clean(redis_client, prefix)


def _expiry(client: redis.Redis, prefix: str, worker: str) -> float | None:
    score = client.zscore(f"{{{prefix}}}:workers", worker)
    return None if score is None else float(score)


def _server_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def test_admissions_renew_the_lease_only_once_a_quarter_of_it_has_passed(redis_client):
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    lease = 2.0
    store = RedisStore(redis_client, prefix, lease=lease, lifecycle=CostLifecycle.never())
    try:
        store.admit("w", [ask("a", job_id="x1")])
        first = _expiry(redis_client, prefix, "w")
        assert first is not None
        renewed_at = first - lease
        store.admit("w", [ask("b", job_id="x2")])
        assert _expiry(redis_client, prefix, "w") == first  # a busy worker's calls: no rewrite

        calls = iter(range(10_000))

        def moved() -> float | None:
            store.admit("w", [ask(f"c{next(calls)}", job_id="x3")])
            expiry = _expiry(redis_client, prefix, "w")
            return expiry if expiry != first else None

        later = wait_until(moved, 10, "an admission to renew the lease", every=0.05)
        assert later - lease >= renewed_at + lease / 4  # not before a quarter of the lease
        assert later > _server_now(redis_client) + lease * 3 / 4 - 0.5
        # A heartbeat renews every time.
        store.heartbeat("w", [], [])
        assert _expiry(redis_client, prefix, "w") > later
    finally:
        store.close()
        clean(redis_client, prefix)


def test_a_worker_whose_lease_was_reclaimed_is_renewed_by_its_next_admission(redis_client):
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    lease = 0.5
    paused = RedisStore(redis_client, prefix, lease=lease, lifecycle=CostLifecycle.never())
    other = RedisStore(
        redis.Redis.from_url(REDIS_URL), prefix, lease=lease, lifecycle=CostLifecycle.never()
    )
    try:
        assert paused.admit("p", [ask("a", type_cap=1)]).grants[0].verdict is Verdict.ADMITTED
        # "p" pauses past its lease; another worker's heartbeat reclaims its job.
        wait_until(
            lambda: other.heartbeat("o", [], []).types == {} or None,
            10,
            "the paused worker's lease to be reclaimed",
            every=0.05,
        )
        assert _expiry(redis_client, prefix, "p") is None
        # Back, "p" admits again: the call must put its lease back at once, or the job it
        # now holds would belong to no live worker.
        assert paused.admit("p", [ask("b", type_cap=1)]).grants[0].verdict is Verdict.ADMITTED
        expiry = _expiry(redis_client, prefix, "p")
        assert expiry is not None
        assert expiry > _server_now(redis_client)
        assert other.heartbeat("o", [], []).types == {"clone": 1}
    finally:
        paused.close()
        other.close()
        other.client.close()
        clean(redis_client, prefix)
