"""Cost learning and the accumulated-cost lifecycle."""

from __future__ import annotations

import pytest
from helpers import drain, make

from celery_fair.core import CostLifecycle, JobType
from celery_fair.errors import ConfigurationError

T = ("t", 8, None, "", 2.0)


def test_estimate_is_default_cost_before_any_observation():
    s, _ = make(8, [T])
    assert s.estimate("t", "x") == 2.0


def test_estimate_is_the_moving_average_in_exactly_the_stated_form():
    s, _ = make(8, [T], alpha=0.3)
    expected = 2.0
    for i, elapsed in enumerate([7.3, 0.1, 12.9]):
        s.submit(i, "t", "x")
        s.schedule()
        s.complete(i, elapsed)
        expected = 0.3 * elapsed + (1 - 0.3) * expected
        assert s.estimate("t", "x") == expected  # bit for bit, not approx


def test_estimates_are_kept_per_type_and_job_id_and_none_is_per_type():
    s, _ = make(8, [T, ("u", 8)])
    for ref, jtype, job_id in [(1, "t", "a"), (2, "t", None), (3, "u", "a")]:
        s.submit(ref, jtype, job_id)
    s.schedule()
    s.complete(1, 10)
    s.complete(2, 20)
    assert s.estimate("t", "a") == pytest.approx(4.4)
    assert s.estimate("t", None) == pytest.approx(7.4)
    assert s.estimate("u", "a") == 1.0


def test_expensive_key_gets_about_a_tenth_of_the_starts_once_estimates_converge():
    # Two keys, one slot; a's jobs take 10x longer than b's. Keep both always pending.
    s, clock = make(1, [JobType("t", 8)])
    starts = {"a": 0, "b": 0}
    n = 0
    for key in "ab":
        s.submit((key, n), "t", key, key)
        n += 1
    for _ in range(600):
        (admission,) = s.schedule()
        key = admission.fairness_key
        starts[key] += 1
        clock.advance(10.0 if key == "a" else 1.0)
        s.complete(admission.uid, 10.0 if key == "a" else 1.0)
        s.submit((key, n), "t", key, key)
        n += 1
    ratio = starts["a"] / starts["b"]
    assert 0.08 < ratio < 0.13, starts


def test_idle_key_is_evicted_after_its_ttl_and_starts_again_from_zero():
    s, clock = make(8, [T], lifecycle=CostLifecycle(cost_ttl=60, estimate_ttl=None))
    s.submit("a", "t", None, "k")
    s.schedule()
    clock.advance(100)  # running, not idle: kept however long
    s.submit("b", "t", None, "other")
    assert s.accumulated_cost("k") == 2.0
    s.complete("a", 1)
    clock.advance(59)
    s.submit("c", "t", None, "other")
    assert "k" in s.snapshot().accumulated_cost
    clock.advance(1)
    s.submit("d", "t", None, "other")
    assert "k" not in s.snapshot().accumulated_cost


def test_unused_estimate_is_evicted_after_its_ttl():
    s, clock = make(8, [T], lifecycle=CostLifecycle(cost_ttl=None, estimate_ttl=30))
    s.submit("a", "t", "x")
    s.schedule()
    s.complete("a", 10)
    assert s.estimate("t", "x") != 2.0
    clock.advance(30)
    s.schedule()
    assert s.estimate("t", "x") == 2.0


def test_periodic_reset_zeroes_every_key_and_reorders_pending_work():
    s, clock = make(1, [T], lifecycle=CostLifecycle(None, None, reset_interval=10))
    s.submit("a1", "t", None, "a", cost=50)
    s.submit("b1", "t", None, "b", cost=1)
    assert drain(s) == ["a1", "b1"]  # a at 50, b at 1
    s.submit("a2", "t", None, "a", arrival=1.0, cost=1)
    s.submit("b2", "t", None, "b", arrival=2.0, cost=1)
    assert s.status("b2").place == 1
    clock.advance(10)
    # After the reset both are at 0: the earlier arrival (a2) comes first.
    assert drain(s) == ["a2", "b2"]
    assert s.accumulated_cost("a") == 1
    assert s.accumulated_cost("b") == 1


def test_advance_idle_raises_a_returning_key_to_the_least_active_cost():
    life = CostLifecycle(cost_ttl=None, estimate_ttl=None, advance_idle=True)
    s, _ = make(1, [T], lifecycle=life)
    s.submit("a1", "t", None, "a", cost=30)
    s.submit("b1", "t", None, "b", cost=40)
    s.schedule()
    s.complete("a1", 1)  # a idle at 30; b active at 0 (not yet admitted)
    s.schedule()  # b1 admitted: b at 40
    s.submit("b2", "t", None, "b", cost=1)
    s.submit("a2", "t", None, "a", cost=1)  # a returns: min active is b at 40
    assert s.accumulated_cost("a") == 40
    s.submit("new", "t", None, "fresh", cost=1)  # brand-new keys are advanced too
    assert s.accumulated_cost("fresh") == 40


def test_advance_idle_never_lowers_a_key():
    life = CostLifecycle(cost_ttl=None, estimate_ttl=None, advance_idle=True)
    s, _ = make(1, [T], lifecycle=life)
    s.submit("a1", "t", None, "a", cost=30)
    s.schedule()
    s.complete("a1", 1)
    s.submit("b1", "t", None, "b", cost=1)
    s.submit("a2", "t", None, "a", cost=1)
    assert s.accumulated_cost("a") == 30


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cost_ttl": 0}, "cost_ttl"),
        ({"estimate_ttl": -1}, "estimate_ttl"),
        ({"reset_interval": float("inf")}, "reset_interval"),
        ({"advance_idle": "yes"}, "advance_idle"),
    ],
)
def test_lifecycle_settings_are_validated(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        CostLifecycle(**kwargs)


def test_a_types_learned_cost_over_its_resources_follows_each_learning_and_expiry():
    from celery_fair.core.costs import Estimates

    e = Estimates(alpha=0.5, ttl=10.0)
    assert e.guess(("t", "new"), 7.0) == (7.0, True)  # nothing learned: the default, named
    e.observe(("t", "a"), 2.0, 6.0, now=0.0)  # 4.0
    e.set(("t", "b"), 8.0, now=5.0)
    e.observe(("u", "a"), 1.0, 1.0, now=5.0)  # another type's: not counted for t
    assert e.type_mean("t") == pytest.approx(6.0)
    assert e.guess(("t", "new"), 7.0) == (pytest.approx(6.0), False)
    assert e.guess(("t", "a"), 7.0) == (4.0, False)  # its own estimate first
    e.observe(("t", "b"), 0.0, 7.0, now=6.0)  # 4.0
    assert e.type_mean("t") == pytest.approx(4.0)
    e.expire(now=10.0)  # ("t", "a") unused since 0
    assert e.type_mean("t") == pytest.approx(4.0)
    e.expire(now=20.0)
    assert e.type_mean("t") is None
    assert e.guess(("t", "new"), 7.0) == (7.0, True)
