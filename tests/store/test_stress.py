"""Eight processes, each with its own connection, hammer one Redis store: caps and conflicts
hold by an independent record, and nothing is left behind."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from shared_redis import REDIS_URL, clean

from celery_fair.store.redis import KEY_NAMES

CLIENTS = 8
CYCLES = 600


def test_eight_processes_never_exceed_a_cap_or_overlap_a_conflict(redis_client):
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    record = f"test-record-{uuid.uuid4().hex[:12]}"
    script = Path(__file__).with_name("stress_client.py")
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), REDIS_URL, prefix, record, str(CYCLES), str(seed)]
            )
            for seed in range(CLIENTS)
        ]
        for proc in procs:
            assert proc.wait(timeout=600) == 0
        assert int(redis_client.get(f"{record}:cycles")) == CLIENTS * CYCLES
        # Enough admissions for the checks below to mean something. At most four jobs hold at
        # once (tier caps 3 and 1), so with all eight processes asking together, as on a loaded
        # host, about half a job is admitted per cycle (2,367 of 4,800 cycles in a CI run, under
        # the half this asked for before): a quarter leaves that its spread.
        assert int(redis_client.get(f"{record}:admitted")) > CLIENTS * CYCLES // 4
        assert redis_client.lrange(f"{record}:violations", 0, -1) == []
        # Every independent count is back to zero, and the store holds nothing running.
        for key in redis_client.scan_iter(match=f"{record}:*"):
            if key.decode().rsplit(":", 1)[-1] not in ("cycles", "admitted", "violations"):
                assert int(redis_client.get(key)) == 0, key
        keys = {name: f"{{{prefix}}}:{name}" for name in KEY_NAMES}
        for name in ("tiers", "types", "conflicts", "jobs", "active", "minacc"):
            assert redis_client.exists(keys[name]) == 0, name
        # Costs were charged and estimates learned along the way.
        assert redis_client.hlen(keys["acc"]) == 3
        assert redis_client.hlen(keys["est"]) == 9
    finally:
        clean(redis_client, prefix)
        for key in redis_client.scan_iter(match=f"{record}:*"):
            redis_client.delete(key)
