"""celery-fair: fair dispatch for Celery workers.

Importing this package (as the module that defines your fair tasks does) registers the fair
pool, so ``celery -A app worker -P fair`` works as written.
"""

from __future__ import annotations

from .api import FairTask, fair_headers, fair_task
from .core import (
    Admission,
    BlockReason,
    CancelOutcome,
    CostLifecycle,
    JobType,
    KeyPolicies,
    KeyPolicy,
    Scheduler,
    SchedulerConfig,
    SimClock,
    WallClock,
)
from .errors import (
    ConfigurationError,
    FairError,
    MessageError,
    QueueFull,
    RunTimeout,
    SchedulerError,
    SlotTimeout,
    StoreUnavailable,
    SubmissionPending,
    TraceError,
)
from .routing import fair_router
from .settings import FairSettings
from .slots import Slot, slot
from .worker import pool as _pool  # noqa: F401  (registers -P fair)

__version__ = "0.1.0.dev0"

__all__ = [
    "Admission",
    "BlockReason",
    "CancelOutcome",
    "ConfigurationError",
    "CostLifecycle",
    "FairError",
    "FairSettings",
    "FairTask",
    "JobType",
    "KeyPolicies",
    "KeyPolicy",
    "MessageError",
    "QueueFull",
    "RunTimeout",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "SimClock",
    "Slot",
    "SlotTimeout",
    "StoreUnavailable",
    "SubmissionPending",
    "TraceError",
    "WallClock",
    "__version__",
    "fair_headers",
    "fair_router",
    "fair_task",
    "slot",
]
