"""celery-fair: fair dispatch for Celery workers."""

from __future__ import annotations

from .core import (
    Admission,
    BlockReason,
    CancelOutcome,
    CostLifecycle,
    JobType,
    Scheduler,
    SchedulerConfig,
    SimClock,
    WallClock,
)
from .errors import (
    ConfigurationError,
    FairError,
    MessageError,
    SchedulerError,
    StoreUnavailable,
    TraceError,
)

__version__ = "0.1.0.dev0"

__all__ = [
    "Admission",
    "BlockReason",
    "CancelOutcome",
    "ConfigurationError",
    "CostLifecycle",
    "FairError",
    "JobType",
    "MessageError",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "SimClock",
    "StoreUnavailable",
    "TraceError",
    "WallClock",
    "__version__",
]
