"""Configuration values validate themselves and name what is wrong."""

from __future__ import annotations

import pytest

from celery_fair.core import JobType, SchedulerConfig, SimClock, WallClock
from celery_fair.errors import ConfigurationError


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "name"),
        ({"priority": 0}, "priority"),
        ({"priority": True}, "priority"),
        ({"priority": 2.5}, "priority"),
        ({"max_concurrency": -1}, "max_concurrency"),
        ({"conflict_group": None}, "conflict_group"),
        ({"default_cost": -1}, "default_cost"),
        ({"default_cost": float("inf")}, "default_cost"),
    ],
)
def test_job_type_rejects_bad_options(kwargs, message):
    options = {"name": "t", "priority": 4, **kwargs}
    with pytest.raises(ConfigurationError, match=message):
        JobType(**options)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capacity": -1}, "capacity"),
        ({"alpha": 0}, "alpha"),
        ({"alpha": 1.5}, "alpha"),
        ({"tier_caps": {0: 1}}, "tier"),
        ({"tier_caps": {4: -1}}, r"tier_caps\[4\]"),
    ],
)
def test_scheduler_config_rejects_bad_options(kwargs, message):
    options = {"capacity": 4, **kwargs}
    with pytest.raises(ConfigurationError, match=message):
        SchedulerConfig(**options)


def test_tier_cap_is_the_priority_unless_overridden():
    config = SchedulerConfig(4, tier_caps={8: 2, 4: None})
    assert (config.tier_cap(8), config.tier_cap(4), config.tier_cap(10)) == (2, None, 10)


def test_sim_clock_moves_only_forward_and_only_when_told():
    clock = SimClock(5)
    clock.advance(1.5)
    clock.set(10)
    assert clock.now() == 10
    with pytest.raises(ValueError, match="back"):
        clock.set(9)
    with pytest.raises(ValueError, match="negative"):
        clock.advance(-1)


def test_wall_clock_reads_epoch_seconds():
    import time

    before = time.time()
    assert before <= WallClock().now() <= time.time()


def test_the_old_name_of_a_jobs_uid_still_reads_it():
    """``ref``, the core's old name for a job's uid, reads the uid for one more release."""
    from celery_fair.core import Scheduler

    s = Scheduler(SchedulerConfig(capacity=1), SimClock(), [JobType("t", priority=4)])
    s.submit("1f0c/retry-2", "t", "a")
    view = s.status("1f0c/retry-2")
    admission = s.next_admission()
    release = s.complete("1f0c/retry-2", 1.0)
    assert view is not None
    assert admission is not None
    assert (view.ref, admission.ref, release.ref) == ("1f0c/retry-2",) * 3
    assert (view.uid, admission.uid, release.uid) == ("1f0c/retry-2",) * 3


def test_a_type_is_read_by_its_name_as_the_types_map_holds_it():
    from celery_fair.core import Scheduler

    s = Scheduler(SchedulerConfig(capacity=2), clock=SimClock())
    s.register_type(JobType("clone", priority=3, max_concurrency=2))
    s.register_type(JobType("push", priority=5))
    for name in ("clone", "push"):
        assert s.type_of(name) is s.types[name]
    with pytest.raises(KeyError):
        s.type_of("nope")
