"""Shared state: the contract (``base``), in memory (``memory``) and in Redis (``redis``)."""

from .base import (
    SCHEMA,
    Ask,
    Done,
    Finished,
    Grant,
    Registered,
    Reply,
    Running,
    Store,
    Verdict,
    View,
    conflict_field,
    estimate_field,
    submission_field,
)
from .memory import MemoryStore
from .redis import RedisStore

__all__ = [
    "SCHEMA",
    "Ask",
    "Done",
    "Finished",
    "Grant",
    "MemoryStore",
    "RedisStore",
    "Registered",
    "Reply",
    "Running",
    "Store",
    "Verdict",
    "View",
    "conflict_field",
    "estimate_field",
    "submission_field",
]
