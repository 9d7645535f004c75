"""Shared state: the contract (``base``), in memory (``memory``) and in Redis (``redis``)."""

from .base import (
    SCHEMA,
    Ask,
    Done,
    Finished,
    Grant,
    Holder,
    Queued,
    QueuedCount,
    Registered,
    Reply,
    Running,
    Store,
    Submission,
    Verdict,
    View,
    conflict_field,
    estimate_field,
    queued_member,
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
    "Holder",
    "MemoryStore",
    "Queued",
    "QueuedCount",
    "RedisStore",
    "Registered",
    "Reply",
    "Running",
    "Store",
    "Submission",
    "Verdict",
    "View",
    "conflict_field",
    "estimate_field",
    "queued_member",
    "submission_field",
]
