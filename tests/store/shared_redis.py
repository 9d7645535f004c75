"""The shared Redis the store tests use, and how they clean up after themselves.

Each test's keys live under a random prefix and are removed with SCAN (never FLUSHALL: the
machine's Redis is shared). Imported by name, not through ``conftest``, which is ambiguous when
several test folders are collected together.
"""

from __future__ import annotations

import redis

REDIS_URL = "redis://127.0.0.1:6379/0"


def clean(client: redis.Redis, prefix: str) -> None:
    for key in client.scan_iter(match=f"{{{prefix}}}:*", count=1000):
        client.delete(key)
