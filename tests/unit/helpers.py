"""Small builders for unit tests of the core."""

from __future__ import annotations

from celery_fair.core import CostLifecycle, JobType, Scheduler, SchedulerConfig, SimClock


def make(capacity=8, types=(), clock=None, **config):
    """A scheduler over ``types`` (JobType or (name, priority, max, group, default_cost))."""
    clock = clock or SimClock()
    jtypes = [t if isinstance(t, JobType) else JobType(*t) for t in types]
    config.setdefault("lifecycle", CostLifecycle.never())
    return Scheduler(SchedulerConfig(capacity, **config), clock, jtypes), clock


def refs(admissions):
    return [a.uid for a in admissions]


def drain(scheduler, elapsed=None):
    """Admit and immediately complete one job at a time; return the refs in order."""
    order = []
    while (a := scheduler.next_admission()) is not None:
        order.append(a.uid)
        if elapsed is None:
            scheduler.release(a.uid)
        else:
            scheduler.complete(a.uid, elapsed(a.uid) if callable(elapsed) else elapsed)
    return order
