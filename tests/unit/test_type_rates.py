"""Rate limits on a job type, on the real core: one bucket for the type's jobs of every key (and
of every priority it runs at), its lane skipped while it is out, as while paused, other
types' jobs taking the slots, its wake, and what undoes a charge."""

from __future__ import annotations

import pytest
from helpers import make, refs

from celery_fair.core import Aging, BlockReason, JobType
from celery_fair.core.inspect import RateLimited
from celery_fair.errors import ConfigurationError
from celery_fair.words import line

EXPORT = JobType("export", priority=4, rate="2/s", burst=2)
CLONE = JobType("clone", priority=4)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"rate": "10/x"}, "job type 'export': rate must be like '10/s'"),
        ({"rate": "1/s", "burst": 0}, "job type 'export': burst must be a number >= 1"),
        ({"rate": "1/s", "per": "hour"}, "job type 'export': per must be one of"),
    ],
)
def test_a_bad_rate_on_a_type_is_refused_naming_the_type(options, words):
    with pytest.raises(ConfigurationError) as err:
        JobType("export", priority=4, **options)
    assert words in str(err.value)


def test_a_type_out_of_its_rate_leaves_its_slots_to_other_types_whatever_the_keys():
    # Given exports limited to 2 a second with a burst of 2, from three keys, and clones
    # unlimited, on four slots,
    s, clock = make(4, (EXPORT, CLONE))
    for i in range(6):
        s.submit(f"e{i}", "export", None, "ABC"[i % 3])
    for i in range(6):
        s.submit(f"c{i}", "clone", None, "D")
    # then two exports start (the type's burst, whichever keys), and clones take the rest;
    started = refs(s.schedule())
    assert sorted(x for x in started if x.startswith("e")) == ["e0", "e1"]
    assert len(started) == 4
    assert s.next_rise() == pytest.approx(0.5)
    why = s.why("e2")
    assert why is not None
    assert why.blockers[0] == RateLimited(None, pytest.approx(0.5), type="export")
    assert line(why.blockers[0]) == "rate limit of type 'export': refills in 0.5 s"
    (view,) = [v for v in s.snapshot().jobs if v.uid == "e2"]
    assert BlockReason.RATE_LIMIT in view.blocked_by
    for uid in started:
        s.complete(uid, 1.0)
    # slots that free before it refills go to clones,
    clock.advance(0.25)
    assert all(x.startswith("c") for x in refs(s.schedule()))
    # and at its wake the type starts one export, of the key furthest behind.
    for v in list(s.snapshot().jobs):
        if v.state.value == "running":
            s.complete(v.uid, 1.0)
    clock.set(s.next_rise())
    assert refs(s.schedule())[0] == "e2"
    assert s.type_rate("export") == (2.0, 2.0, False)
    assert s.type_rate("clone") is None


def test_a_type_never_starts_more_than_its_burst_plus_its_rate_over_time():
    # Given a backlog of exports on many keys and slots to spare, decided every 50 ms for 10 s,
    s, clock = make(8, (EXPORT, CLONE))
    for i in range(100):
        s.submit(f"e{i}", "export", None, f"k{i % 7}")
    starts: list[float] = []
    for step in range(201):
        clock.set(step * 0.05)
        for uid in refs(s.schedule()):
            starts.append(clock.now())
            s.complete(uid, 0.01)
    # then it started its burst and its rate's worth, no more, and no fewer,
    assert len(starts) == 2 + 2 * 10
    # in no window of a second more than the burst and a second's rate.
    assert max(sum(1 for t in starts if t0 <= t < t0 + 1.0) for t0 in starts) <= 2 + 2


def test_an_urgent_export_never_passes_its_types_rate():
    # Given an aging export type limited to one start a second, one export running,
    aging = Aging(grace=0, interval=1, max_effective_priority=8, urgent_threshold=8)
    export = JobType("export", priority=4, rate="1/s", aging=aging)
    s, clock = make(4, (export,))
    for i in range(2):
        s.submit(f"e{i}", "export", None, "A")
    assert refs(s.schedule()) == ["e0"]
    # when the other has waited long enough to turn urgent and the fleet used the bucket up,
    clock.advance(4.0)
    s.set_type_tokens("export", -1.0)
    # then it waits for the refill all the same (a rate is no cap an urgent job passes).
    assert refs(s.schedule()) == []
    assert s.next_rise() == pytest.approx(clock.now() + 2.0)
    clock.set(s.next_rise() or 0.0)
    assert refs(s.schedule()) == ["e1"]


def test_one_bucket_spans_the_priorities_the_type_runs_at():
    # Given exports at the type's priority and at another (a side lane), both from one bucket,
    s, _ = make(4, (EXPORT,), tier_caps={9: None})
    s.submit("e0", "export", None, "A")
    s.submit("e1", "export", None, "B", priority=9)
    s.submit("e2", "export", None, "C", priority=9)
    # then the burst of 2 is the type's, at any priority.
    assert sorted(refs(s.schedule())) == ["e1", "e2"]
    assert refs(s.schedule()) == []


def test_an_admission_undone_or_refunded_gives_the_type_its_charge_back():
    s, _ = make(4, (EXPORT,))
    for i in range(3):
        s.submit(f"e{i}", "export", None, "A")
    first = refs(s.schedule())
    assert len(first) == 2
    # a job that never ran is refunded: its charge goes back, and the next may start,
    s.release(first[0], refund=True)
    assert refs(s.schedule()) == ["e2"]


def test_the_fleets_bucket_level_from_a_store_halts_and_frees_the_type():
    s, _ = make(4, (EXPORT, CLONE))
    s.set_type_tokens("export", 0.0)  # the fleet used it up
    s.submit("e0", "export", None, "A")
    s.submit("c0", "clone", None, "B")
    assert refs(s.schedule()) == ["c0"]
    assert s.next_rise() == pytest.approx(0.5)
    s.set_type_tokens("export", 1.0)
    assert refs(s.schedule()) == ["e0"]
    s.set_type_tokens("nope", 1.0)  # not a registered type: nothing
