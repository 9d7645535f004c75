"""Rate limits by fairness key, on the real core: the bucket rule (core/rates.py), a key out of
its rate as a blocker whose slot others take, its wake, and what undoes a charge."""

from __future__ import annotations

import random

import pytest
from helpers import make, refs

from celery_fair.core import Aging, BlockReason, JobType, KeyPolicies, KeyPolicy
from celery_fair.core.inspect import RateLimited
from celery_fair.core.rates import level_at, parse_rate, refill_at
from celery_fair.errors import ConfigurationError
from celery_fair.words import line

CLONE = ("clone", 8, None, "", 1)


def limited(spec, capacity=4, types=(CLONE,), **config):
    return make(capacity, types, keys=KeyPolicies.from_mapping(spec), **config)


@pytest.mark.parametrize(
    ("text", "per_second"),
    [("10/s", 10.0), ("600/m", 10.0), ("5000/h", 5000 / 3600), ("1/5m", 1 / 300), (2.5, 2.5)],
)
def test_a_rate_reads_as_units_per_second(text, per_second):
    assert parse_rate(text) == pytest.approx(per_second)
    assert KeyPolicy(rate=text).rate == pytest.approx(per_second)


@pytest.mark.parametrize("bad", ["10", "10/x", "0/s", "-1/s", "ten/s", "", True, 0, None])
def test_a_bad_rate_is_refused_saying_what_a_rate_looks_like(bad):
    with pytest.raises(ConfigurationError, match="rate must be"):
        parse_rate(bad)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"rate": "10/x"}, "rate must be like '10/s'"),
        ({"rate": "1/s", "burst": 0.5}, "burst must be a number >= 1"),
        ({"rate": "1/s", "per": "hour"}, "per must be one of ('job', 'cost')"),
    ],
)
def test_a_bad_rate_option_in_fair_keys_is_refused(options, words):
    with pytest.raises(ConfigurationError) as err:
        KeyPolicies.from_mapping({"acme": options})
    assert words in str(err.value)


def test_a_bucket_refills_at_its_rate_up_to_its_burst_and_a_wait_always_pays_the_debt():
    assert level_at(-1.0, 10.0, 10.5, 4.0, 3.0) == 1.0
    assert level_at(-1.0, 10.0, 20.0, 4.0, 3.0) == 3.0  # no more than the burst
    assert level_at(2.0, 10.0, 9.0, 4.0, 3.0) == 2.0  # a clock that went back refills nothing
    for level, stamp, rate in [
        (-1.0, 0.0, 3.0),
        (-0.1, 17.3, 0.7),
        (0.0, 5.0, 10.0),
        (-29.0, 1.7e9, 1 / 3),
        (-1.0, 1.7e9 + 0.1, 3.0),
    ]:
        at = refill_at(level, stamp, rate)
        assert at > stamp
        assert level_at(level, stamp, at, rate, 1.0) >= 1  # woken then, it may start
        assert at - stamp == pytest.approx((1 - level) / rate, abs=1e-6)


def test_a_key_out_of_its_rate_leaves_its_slots_to_others_and_runs_again_when_it_refills():
    # Given A limited to 2 a second with a burst of 2, on four slots, and B unlimited,
    s, clock = limited({"A": {"rate": "2/s", "burst": 2}})
    for i in range(6):
        s.submit(f"a{i}", "clone", None, "A")
    for i in range(6):
        s.submit(f"b{i}", "clone", None, "B")
    # A starts its burst, and B takes the slots A may not use (work-conserving);
    started = refs(s.schedule())
    assert sorted(x for x in started if x.startswith("a")) == ["a0", "a1"]
    assert len(started) == 4
    assert s.next_rise() == pytest.approx(0.5)  # A's bucket is above 0 again then
    (view,) = [v for v in s.snapshot().jobs if v.uid == "a2"]
    assert BlockReason.RATE_LIMIT in view.blocked_by
    why = s.why("a2")
    assert why is not None
    assert why.blockers[0] == RateLimited("A", pytest.approx(0.5))
    assert line(why.blockers[0]) == "rate limit of key 'A': refills in 0.5 s"
    for uid in started:
        s.complete(uid, 1.0)
    # when slots free before it refills, they go to B;
    clock.advance(0.25)
    assert all(x.startswith("b") for x in refs(s.schedule()))
    assert s.blocked_counts()["rate_limit"] == 4
    # at its wake, A starts one (its bucket holds one start's worth, less a debt of nothing).
    for a in list(s.snapshot().jobs):
        if a.state.value == "running":
            s.complete(a.uid, 1.0)
    clock.set(s.next_rise())
    assert refs(s.schedule())[0] == "a2"


def test_a_key_out_of_its_rate_is_read_last_until_its_bucket_refills():
    # Given A at 2 a second (burst 2) and B unlimited, each with a backlog, on four slots,
    s, clock = limited({"A": {"rate": "2/s", "burst": 2}})
    for i in range(6):
        s.submit(f"a{i}", "clone", None, "A")
        s.submit(f"b{i}", "clone", None, "B")
    assert s.read_cost("A") == s.read_cost("B") == 0.0  # nothing used: its order cost
    # when A has started its burst, a queue of A's is read after any other: none of its
    # messages could start;
    s.schedule()
    assert s.read_cost("A") == float("inf")
    assert s.read_cost("B") == s.accumulated_cost("B") > 0
    # and from the moment its bucket holds a start's worth again, before any decision runs,
    # by its cost again.
    clock.set(s.next_rise() - 0.01)
    assert s.read_cost("A") == float("inf")
    clock.set(s.next_rise())
    assert s.read_cost("A") == s.accumulated_cost("A")
    assert s.read_cost("nobody") == 0.0


def test_a_key_never_starts_more_than_its_burst_plus_its_rate_in_any_window():
    # Given A at 5 a second with a burst of 3, backlogged, and jobs ending at random times,
    rng = random.Random(7)
    s, clock = limited({"A": {"rate": "5/s", "burst": 3}}, capacity=8)
    for i in range(400):
        s.submit(f"a{i}", "clone", None, "A")
    starts: list[float] = []
    running: list[tuple[float, str]] = []
    while clock.now() < 30:
        for a in s.schedule():
            starts.append(clock.now())
            running.append((clock.now() + rng.uniform(0.01, 0.5), a.uid))
        running.sort()
        ends = [t for t, _ in running[:1]]
        wake = s.next_rise()
        step = min([*ends, *([wake] if wake is not None else []), clock.now() + 0.2])
        clock.set(max(step, clock.now()))
        while running and running[0][0] <= clock.now():
            s.complete(running.pop(0)[1], 0.1)
    # then in every window of T seconds it started at most 3 + 5 T, and over the run its
    # rate is 5 a second.
    for i, t0 in enumerate(starts):
        for t1 in starts[i:]:
            assert sum(1 for t in starts if t0 <= t <= t1) <= 3 + 5 * (t1 - t0) + 1e-9
    assert len(starts) / 30 == pytest.approx(5, rel=0.05)


def test_per_cost_charges_a_start_its_estimate_so_expensive_jobs_wait_longer():
    # Given a key charged by cost at 1 second of cost a second, and jobs of cost 3,
    s, _ = limited({"A": {"rate": "1/s", "per": "cost"}})
    for i in range(3):
        s.submit(f"a{i}", "clone", None, "A", cost=3.0)
    # one starts (the bucket held 1), and the next waits for the debt of 2 and 1 more.
    assert refs(s.schedule()) == ["a0"]
    assert s.next_rise() == pytest.approx(3.0)


def test_an_undone_start_gives_its_charge_back():
    s, _ = limited({"A": {"rate": "1/m"}})
    s.submit("a0", "clone", None, "A")
    s.submit("a1", "clone", None, "A")
    assert refs(s.schedule()) == ["a0"]
    assert s.next_refill() is not None
    s.revert("a0")  # the store refused it: the start never happened
    assert s.next_refill() is None
    assert refs(s.schedule()) == ["a0"]
    s.release("a0", refund=True)  # admitted, then revoked before it began
    assert refs(s.schedule()) == ["a1"]


def test_the_fleets_bucket_from_a_store_limits_a_key_until_it_refills():
    s, clock = limited({"A": {"rate": "2/s", "burst": 4}})
    s.submit("a0", "clone", None, "A")
    s.set_tokens("A", -1.0)  # other workers used it up, and more
    assert s.schedule() == []
    assert s.next_rise() == pytest.approx(1.0)
    clock.advance(1.0)
    assert refs(s.schedule()) == ["a0"]
    s.set_tokens("nobody", -1.0)  # a key the core does not know: nothing to do
    with pytest.raises(Exception, match="finite"):
        s.set_tokens("A", float("nan"))


def test_removing_a_rate_at_run_time_lets_the_key_run_at_once():
    s, _ = limited({"A": {"rate": "1/h"}})
    for i in range(3):
        s.submit(f"a{i}", "clone", None, "A")
    assert refs(s.schedule()) == ["a0"]
    s.set_key_policies(KeyPolicies())
    assert refs(s.schedule()) == ["a1", "a2"]
    assert s.next_rise() is None


def test_an_urgent_job_does_not_pass_its_keys_rate_limit():
    aging = Aging(interval=1.0, grace=0.0, urgent_threshold=9)
    s, clock = limited({"A": {"rate": "1/h"}}, capacity=2, aging=aging)
    s.submit("a0", "clone", None, "A")
    s.submit("a1", "clone", None, "A")
    assert refs(s.schedule()) == ["a0"]
    clock.advance(60)  # a1 is urgent by now
    (view,) = [v for v in s.snapshot().jobs if v.uid == "a1"]
    assert view.urgent
    assert s.schedule() == []
    assert s.why("a1").blockers[0].reason is BlockReason.RATE_LIMIT


def test_a_rate_limit_of_a_type_of_its_own_name_is_not_a_key_rate():
    # a type named like a key takes nothing of the key's rate
    s, _ = limited({"A": {"rate": "1/h"}}, types=(CLONE, JobType("A", 8)))
    s.submit("x", "A", None, "B")
    s.submit("y", "A", None, "B")
    assert refs(s.schedule()) == ["x", "y"]
