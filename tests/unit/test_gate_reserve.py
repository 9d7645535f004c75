"""The reserve and the pool's size on the gate alone (gate_world.py): jobs admitted ahead of a
free pool process (``lookahead``) wait reserved; a set lookahead stays as set, the default one
follows the jobs' wall times (``plan_reserve``, ``ReserveDepth``); a newcomer that ranks first
takes the place of reserved jobs that would hold it up longer than ``fair_reserve_seconds``;
and the gate starts as many jobs as the pool has processes now (autoscale moves it).

What a real pool adds (its own timing, a store call gathered on the event loop, a real
autoscaler) is tests/integration/test_lookahead.py's and test_worker_lifecycle.py's.
"""

from __future__ import annotations

import pytest
from celery.concurrency.prefork import TaskPool as Prefork
from gate_world import World

from celery_fair.core import ReserveDepth
from celery_fair.settings import FairSettings
from celery_fair.worker.reserve import RESERVE_MAX, plan_reserve


@pytest.fixture
def prefork() -> Prefork:
    """A prefork pool of two processes, not started: what ``plan_reserve`` looks at."""
    return Prefork(limit=2)


def settings(**options: object) -> FairSettings:
    return FairSettings.from_mapping({"fair_shards": 1, **options})


def test_the_reserve_is_planned_from_the_settings_the_store_and_the_pool(prefork: Prefork) -> None:
    # A set lookahead is kept as set and does not follow the jobs;
    assert plan_reserve(settings(fair_lookahead=2), prefork, shared=True) == (2, None)
    # unset, with a shared store, it starts at 1 and follows the jobs' wall times, up to 8;
    lookahead, sizer = plan_reserve(settings(), prefork, shared=True)
    assert lookahead == 1
    assert sizer is not None
    assert (sizer.window, sizer.minimum, sizer.maximum) == (
        settings().reserve_seconds,
        1,
        RESERVE_MAX,
    )
    # alone there is none (the core decides at once).
    assert plan_reserve(settings(), prefork, shared=False) == (0, None)


def run_short_jobs(w: World, n: int, seconds: float, repos: int, tag: str) -> int:
    """Deliver ``n`` jobs of key A over ``repos`` repos, then end each run ``seconds`` after it
    started, oldest first, until none is left. Returns the most jobs reserved at once."""
    for i in range(n):
        w.deliver(f"{tag}{i}", key="A", job_id=f"{tag}-r{i % repos}")
    deepest = 0
    while w.pool.running():
        deepest = max(deepest, w.stats()["fair-reserved"])
        w.run(w.pool.running()[0], seconds)
    return deepest


def test_the_default_reserve_is_deep_for_short_jobs_and_one_for_long_ones(
    prefork: Prefork,
) -> None:
    # Given two processes with the default reserve of a worker on a shared store,
    lookahead, sizer = plan_reserve(settings(), prefork, shared=True)
    w = World(slots=2, lookahead=lookahead, sizer=sizer)
    assert w.stats()["fair-lookahead"] == 1  # nothing timed yet
    # when it has run 60 jobs of a millisecond, on 30 repos,
    deepest = run_short_jobs(w, 60, 0.001, 30, "s")
    # then it keeps several admitted ahead (2 processes free many slots in 10 ms), at most 8,
    short = w.stats()
    assert 3 <= short["fair-lookahead"] <= RESERVE_MAX, short
    assert w.gate.lookahead == short["fair-lookahead"]
    assert short["fair-slots"] == 2
    assert deepest >= 2  # and the reserve did hold that many
    # and after 12 jobs of 0.3 s, one: a second would wait about 0.15 s, far past 10 ms.
    run_short_jobs(w, 12, 0.3, 12, "l")
    assert w.stats()["fair-lookahead"] == 1
    # The pool never ran more than its size, whatever the depth, and every job ran once.
    assert w.pool.peak == 2
    assert len(w.pool.ids()) == len(set(w.pool.ids())) == 72


def test_a_fixed_lookahead_does_not_follow_the_jobs() -> None:
    # Given two processes with fair_lookahead = 2 set (no sizer),
    w = World(slots=2, lookahead=2)
    # when it has run short jobs,
    deepest = run_short_jobs(w, 30, 0.001, 30, "s")
    # then its reserve is still 2, and was used.
    assert (w.gate.lookahead, w.stats()["fair-lookahead"]) == (2, 2)
    assert deepest == 2
    assert w.pool.peak == 2


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(
    ("reserve_seconds", "order", "given_back"),
    [
        # B goes before A's reserved job, estimated at the default 1 s: more than the 10 ms
        # of reserved work a newcomer may wait behind by default, so B takes its place;
        (None, ["busy", "B", "next"], 1),
        # with up to 5 s allowed, the reserved job keeps its place and B starts after it.
        (5.0, ["busy", "next", "B"], 0),
    ],
)
def test_a_newcomer_that_ranks_first_takes_the_reserved_place_unless_it_is_within_bound(
    shared: bool, reserve_seconds: float | None, order: list[str], given_back: int
) -> None:
    # Given one process busy with client A's job and A's next job reserved behind it,
    options = {} if reserve_seconds is None else {"fair_reserve_seconds": reserve_seconds}
    w = World(slots=1, lookahead=1, shared=shared, **options)
    busy = w.deliver("busy", key="A", job_id="r0")
    w.deliver("next", key="A", job_id="r1")
    assert w.gate.job_status("next")["state"] == "reserved"
    assert w.stats()["fair-reserved"] == 1
    # when client B, who has used nothing, sends a job,
    w.deliver("B", key="B", job_id="b0")
    # then the jobs start in the order the bound gives.
    w.pool.finish(busy)
    w.pool.finish(w.pool.running()[0])
    w.pool.finish(w.pool.running()[0])
    assert w.pool.ids() == order
    assert w.stats()["fair-store-given_back"] == given_back


def test_the_gate_starts_as_many_jobs_as_the_pool_has_processes_now() -> None:
    # Given a pool of one process and a backlog of nine jobs of nine keys,
    w = World(slots=1)
    for i in range(9):
        w.deliver(f"j{i}", key=f"k{i}", job_id=f"r{i}")
    assert len(w.pool.running()) == 1
    # when autoscale grows it to three, the next sweep follows: three run, never more;
    w.pool.num_processes = 3
    w.gate.sweep()
    assert (w.gate.pool_slots, w.stats()["fair-slots"]) == (3, 3)
    assert len(w.pool.running()) == 3
    w.pool.finish(w.pool.running()[0])
    assert len(w.pool.running()) == 3
    assert w.pool.peak == 3
    # when it shrinks back to one, no job starts until fewer than one run.
    w.pool.num_processes = 1
    w.gate.sweep()
    assert w.gate.pool_slots == 1
    w.pool.finish(w.pool.running()[0])
    w.pool.finish(w.pool.running()[0])
    assert len(w.pool.running()) == 1
    started = len(w.pool.ids())
    w.pool.finish(w.pool.running()[0])
    assert len(w.pool.running()) == 1
    assert len(w.pool.ids()) == started + 1
    assert w.pool.peak == 3


def test_a_reserve_sizer_applies_its_depth_to_the_gate_after_each_timed_run() -> None:
    # (the sizer is the core's; the gate feeds it each run's wall time, on the pool's size)
    sizer = ReserveDepth(0.01, minimum=1, maximum=RESERVE_MAX)
    w = World(slots=2, lookahead=1, sizer=sizer)
    first = w.deliver("t0", key="A", job_id="r0")
    w.run(first, 0.004)
    assert w.gate.lookahead == sizer.depth(2) > 1
