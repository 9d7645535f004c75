"""celery-fair: fair dispatch for Celery workers.

The public face: every name below is loaded on first use (``celery_fair.fair_task`` imports
the producer side then), so ``import celery_fair.core`` or ``celery_fair.sim`` needs neither
Celery nor Kombu. The fair pool is registered (``celery -A app worker -P fair``) as soon as
this package is imported into a process that has Celery loaded, as the worker's command line
does before it imports your app, and otherwise on the first use of a name that needs Celery;
registering imports no part of the worker. Layers and where each part lives: docs/design.md,
section 7.
"""

from __future__ import annotations

import sys
from importlib import import_module
from typing import TYPE_CHECKING, Any

from ._version import __version__
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

if TYPE_CHECKING:
    from .api import FairTask, fair_headers, fair_task, send
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
    from .routing import fair_router
    from .settings import FairSettings
    from .slots import Slot, slot

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
    "send",
    "slot",
]

#: Where each lazily loaded public name lives, and whether it needs Celery (then the fair pool
#: is registered when it is first used).
_LAZY: dict[str, tuple[str, bool]] = {
    **dict.fromkeys(("FairTask", "fair_headers", "fair_task", "send"), (".api", True)),
    **dict.fromkeys(
        (
            "Admission",
            "BlockReason",
            "CancelOutcome",
            "CostLifecycle",
            "JobType",
            "KeyPolicies",
            "KeyPolicy",
            "Scheduler",
            "SchedulerConfig",
            "SimClock",
            "WallClock",
        ),
        (".core", False),
    ),
    "fair_router": (".routing", True),
    "FairSettings": (".settings", True),
    **dict.fromkeys(("Slot", "slot"), (".slots", True)),
}


def __getattr__(name: str) -> Any:
    """A public name, or a submodule (``celery_fair.control``), loaded on first use."""
    if name in _LAZY:
        where, needs_celery = _LAZY[name]
        if needs_celery:
            _register_pool()
        value = getattr(import_module(where, __name__), name)
    elif not name.startswith("__"):
        try:
            value = import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _register_pool() -> None:
    """Make ``-P fair`` a valid pool (Celery reads its pool aliases when the worker starts)."""
    from .worker.alias import register

    register()


if "celery" in sys.modules:
    # The worker's command line (or an app) has loaded Celery: register now, at no cost, so an
    # app module that only writes ``import celery_fair`` still gets ``-P fair``.
    _register_pool()
