"""The engine: several workers' cores sharing one store, on both stores.

Each engine stands for one worker. Calls are made inline (``run_inline``), as the synchronous
consumer loop makes them; the gate's threaded path makes the same calls elsewhere.
"""

from __future__ import annotations

import pytest
from harness import wait_until
from test_contract import ask

from celery_fair.core import (
    Aging,
    BlockReason,
    CostLifecycle,
    JobType,
    KeyPolicies,
    Scheduler,
    SchedulerConfig,
    SimClock,
)
from celery_fair.engine import Engine, Mode
from celery_fair.errors import StoreUnavailable
from celery_fair.observe import Observer
from celery_fair.policies import FleetPolicies
from celery_fair.store import Done

NEVER = CostLifecycle.never()
TYPES = [
    JobType("clone", 8, max_concurrency=2, conflict_group="git", default_cost=1.0),
    JobType("bg", 2, conflict_group="git", default_cost=1.0),
    JobType("fetch", 8, conflict_group="git", default_cost=1.0),  # no type cap
]


class Cuttable:
    """A store whose link can be cut: every call raises ``StoreUnavailable`` while cut."""

    def __init__(self, store):
        self.store = store
        self.cut = False
        self.lease = store.lease

    def __getattr__(self, name):
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            if self.cut:
                raise StoreUnavailable("the link to the store is cut (test)")
            return attr(*args, **kwargs)

        return call


@pytest.fixture
def clock():
    return SimClock(1000.0)


@pytest.fixture
def fleet(make_store, clock, kind):
    """``fleet(n, **engine_options)``: n engines (workers) on one shared store."""

    def factory(n=2, capacity=4, lease=30.0, store_options=None, keys=None, aging=None, **options):
        store_options = dict(lifecycle=NEVER, lease=lease, **(store_options or {}))
        if kind == "memory":
            store_options["clock"] = clock
        engines = []
        for i in range(n):
            store = make_store(**store_options)
            policies = KeyPolicies.from_mapping(keys or {})
            core = Scheduler(
                SchedulerConfig(capacity, lifecycle=NEVER, keys=policies, aging=aging),
                clock,
                TYPES,
            )
            options.setdefault("poll_interval", 1.0)
            engines.append(Engine(core, store, worker=f"w{i}", clock=clock, **options))
        return engines

    return factory


def started(decision):
    return [a.uid for a in decision.start]


def test_alone_the_core_decides():
    clock = SimClock()
    core = Scheduler(SchedulerConfig(1, lifecycle=NEVER), clock, TYPES)
    engine = Engine(core)
    engine.submit("a", "clone", "linux", "k", arrival=0)
    decision = engine.decide()
    assert engine.mode is Mode.ALONE
    assert started(decision) == ["a"]
    assert decision.call is None


def test_a_type_cap_counts_every_worker(fleet, clock):
    one, two = fleet(2)
    for i in range(3):
        one.submit(f"a{i}", "clone", f"r{i}", "k", arrival=clock.now())
    two.submit("b0", "clone", "x", "k", arrival=clock.now())
    assert started(one.run_inline()) == ["a0", "a1"]  # the type cap is 2
    # The second worker proposes b0, the store refuses it, and its core learns why.
    assert started(two.run_inline()) == []
    assert two.observer.counts["refused"] == 1
    assert two.core.status("b0").blocked_by  # blocked by the type cap, fleet-wide
    # The first worker's next job takes the slot its finished job frees, in the same call,
    one.finish("a0", 1.0, final=True)
    assert started(one.run_inline()) == ["a2"]
    clock.advance(1.0)
    assert started(two.run_inline()) == []
    # and when the first worker lets go of one with nothing left to run, the second worker
    # sees it at its next look at the store.
    one.finish("a1", 1.0, final=True)
    one.run_inline()
    clock.advance(1.0)
    assert started(two.run_inline()) == ["b0"]


def test_a_worker_waiting_on_others_looks_again_about_as_often_as_their_jobs_end(fleet, clock):
    # Given the first worker running the two clones the type's cap allows (each costs 1 s, its
    # default), and the second worker holding one that the store refused for the cap,
    one, two = fleet(2, poll_interval=5.0)
    for i in range(2):
        one.submit(f"a{i}", "clone", f"r{i}", "k", arrival=clock.now())
    assert started(one.run_inline()) == ["a0", "a1"]
    two.submit("b0", "clone", "x", "k", arrival=clock.now())
    assert started(two.run_inline()) == []
    clock.advance(5.0)  # (its first look: it knew nothing yet of what the others run)
    assert started(two.run_inline()) == []
    # when one of the first worker's clones ends,
    one.finish("a1", 1.0, final=True)
    one.run_inline()
    # then the second looks again after about the time one of two 1 s jobs takes to end,
    # half a second, not after fair_store_poll_interval (5 s here).
    clock.advance(0.49)
    assert started(two.run_inline()) == []
    clock.advance(0.01)
    assert started(two.run_inline()) == ["b0"]


def test_a_key_cap_counts_every_worker_and_a_held_back_key_learns_when_it_frees(fleet, clock):
    one, two = fleet(2, keys={"tenant": {"max_concurrency": 2}})
    for i in range(3):
        one.submit(f"a{i}", "fetch", f"r{i}", "tenant", arrival=clock.now())
    two.submit("b0", "fetch", "x", "tenant", arrival=clock.now())
    two.submit("c0", "fetch", "y", "other", arrival=clock.now())
    assert started(one.run_inline()) == ["a0", "a1"]  # the key's cap is 2
    # The second worker proposes b0 first (tenant is cheaper here), the store refuses it,
    # and its core learns that tenant runs 2 elsewhere: c0 goes in the same call.
    assert started(two.run_inline()) == ["c0"]
    assert two.observer.counts["refused"] == 1
    assert two.core.status("b0").blocked_by == (BlockReason.KEY_CAP,)
    assert started(two.run_inline()) == []  # held back: not proposed again
    one.finish("a0", 1.0, final=True)
    assert started(one.run_inline()) == ["a2"]  # the first worker's next takes the place
    one.finish("a1", 1.0, final=True)
    one.run_inline()
    clock.advance(1.0)  # the second worker's next look at the store (a beat) sees 1 run
    assert started(two.run_inline()) == ["b0"]


def test_a_job_aged_into_urgency_passes_its_keys_cap_in_the_store_too(fleet, clock):
    aging = Aging(interval=1.0, max_effective_priority=8, urgent_threshold=8)
    one, two = fleet(2, keys={"tenant": {"max_concurrency": 1}}, aging=aging)
    one.submit("a0", "fetch", "r0", "tenant", arrival=clock.now())
    assert started(one.run_inline()) == ["a0"]
    two.submit("b0", "bg", "x", "tenant", arrival=clock.now())  # priority 2: urgent at 8
    assert started(two.run_inline()) == []
    assert two.core.status("b0").blocked_by == (BlockReason.KEY_CAP,)
    clock.advance(6.0)
    assert started(two.run_inline()) == ["b0"]
    view = two.store.heartbeat("w1", [], ["tenant"])
    assert view.keys == {"tenant": 2}  # both run, fleet-wide: the cap of 1 passed
    assert two.core.status("b0").urgent


def test_an_urgent_job_gets_the_next_slot_of_a_shared_cap_before_another_workers_backlog(
    fleet, clock
):
    # Tier 2 is capped at 2 fleet-wide. The first worker has a backlog of it: without a
    # claim, each job it finishes hands its slot to its next one in the same call, and the
    # second worker's job would wait for as long as that backlog lasts, urgent or not.
    aging = Aging(interval=1.0, max_effective_priority=8, urgent_threshold=8)
    one, two = fleet(2, aging=aging)
    for i in range(2):
        one.submit(f"b{i}", "bg", f"r{i}", "busy", arrival=clock.now())
    assert started(one.run_inline()) == ["b0", "b1"]
    two.submit("u", "bg", "x", "patient", arrival=clock.now())
    assert started(two.run_inline()) == []  # refused: the tier is full
    assert started(two.run_inline()) == []  # and not proposed again
    assert two.observer.counts["refused"] == 1
    clock.advance(6.0)  # 2 + 6 levels: urgent at 8
    for i in range(2, 6):  # the backlog goes on, young
        one.submit(f"b{i}", "bg", f"r{i}", "busy", arrival=clock.now())
    assert started(two.run_inline()) == []  # proposed, refused: its claim holds the next slot
    assert two.observer.counts["refused"] == 2
    one.finish("b0", 1.0, final=True)
    assert started(one.run_inline()) == []  # b2 is refused: the slot b0 freed is u's
    assert one.core.status("b2").blocked_by == (BlockReason.TIER_CAP,)
    assert started(one.run_inline()) == []  # and not proposed again: the reply counted it
    clock.advance(1.0)  # the second worker's next poll
    assert started(two.run_inline()) == ["u"]
    assert two.core.status("u").urgent
    one.finish("b1", 1.0, final=True)
    assert started(one.run_inline()) == ["b2"]  # the claim is gone with u's start


def test_runtime_policies_reach_every_worker_with_its_next_beat(fleet, clock):
    one, two = fleet(2, capacity=3, keys={"tenant": {"max_concurrency": 2}})
    two.submit("t0", "fetch", "y", "tenant", arrival=clock.now())
    assert started(two.run_inline()) == ["t0"]
    policies = FleetPolicies(store=one.store)
    policies.set("tenant", max_concurrency=1, weight=4)
    policies.pause_key("spam")
    # Before its next beat the worker knows neither, but the store refuses the paused key's
    # job at once, and that refusal makes the next call a beat, which brings both.
    two.submit("s0", "fetch", "x", "spam", arrival=clock.now())
    assert started(two.run_inline()) == []
    assert two.observer.counts["refused"] == 1
    assert two.core.paused[0] == frozenset({"spam"})
    assert two.core.key_terms("tenant") == (1, 4.0)
    assert two.core.status("s0").blocked_by == (BlockReason.PAUSED,)
    two.submit("t1", "fetch", "z", "tenant", arrival=clock.now())
    assert started(two.run_inline()) == []  # the new cap of 1: t0 runs
    assert two.core.status("t1").blocked_by == (BlockReason.KEY_CAP,)
    # A resume and a reset reach it with a beat (at most a second later).
    policies.resume_key("spam")
    policies.reset("tenant")
    clock.advance(two.beat_interval)
    assert sorted(started(two.run_inline())) == ["s0", "t1"]
    assert two.core.key_terms("tenant") == (2, 1.0)  # the configured policy again
    # A document the workers cannot read changes nothing and is logged.
    one.store.update_policies(lambda old: ("not json", [], [], []))
    clock.advance(two.beat_interval)
    two.run_inline()
    assert two.core.key_terms("tenant") == (2, 1.0)


def test_a_weight_is_charged_fleet_wide(fleet, clock):
    one, two = fleet(2, capacity=1, keys={"big": {"weight": 4}})
    one.submit("b0", "fetch", "x", "big", arrival=clock.now(), cost=8.0)
    assert started(one.run_inline()) == ["b0"]
    assert one.core.accumulated_cost("big") == 2.0
    assert one.store.accumulated_cost("big") == 2.0
    one.finish("b0", 8.0, final=True)
    one.run_inline()
    two.submit("b1", "fetch", "y", "big", arrival=clock.now())
    two.core.set_capacity(0)
    two.run_inline()  # a beat reads the fleet's cost of the held key
    assert two.core.accumulated_cost("big") == 2.0


def test_a_conflict_held_by_another_worker_parks_the_job_until_it_is_released(fleet, clock):
    one, two = fleet(2)
    one.submit("a", "clone", "linux", "k", arrival=clock.now())
    assert started(one.run_inline()) == ["a"]
    two.submit("b", "clone", "linux", "k", arrival=clock.now())
    two.submit("c", "clone", "git", "k", arrival=clock.now())
    assert started(two.run_inline()) == ["c"]
    assert two.core.held_elsewhere() == [("git", "linux")]
    assert started(two.run_inline()) == []  # parked: not proposed again, no call wasted
    one.finish("a", 1.0, final=True)
    one.run_inline()
    clock.advance(1.0)  # the next look at the store
    assert started(two.run_inline()) == ["b"]


def test_accumulated_costs_are_the_fleets(fleet, clock):
    one, two = fleet(2, capacity=1)
    # Key "heavy" has consumed 10 on the first worker...
    one.submit("h0", "clone", "x0", "heavy", arrival=clock.now(), cost=10.0)
    assert started(one.run_inline()) == ["h0"]
    one.finish("h0", 10.0, final=True)
    one.run_inline()
    # ...so on the second worker, a later job of "light" goes first once costs are refreshed.
    two.submit("h1", "clone", "x1", "heavy", arrival=clock.now())
    two.submit("l1", "clone", "x2", "light", arrival=clock.now() + 1)
    two.core.set_capacity(0)
    two.run_inline()  # the first exchange (a beat) reads the held keys' costs
    assert two.core.accumulated_cost("heavy") == 10.0
    two.core.set_capacity(1)
    assert started(two.run_inline()) == ["l1"]


def test_the_fencing_token_comes_from_the_store_and_grows(fleet, clock):
    one, two = fleet(2)
    one.submit("a", "clone", "r1", "k", arrival=clock.now())
    two.submit("b", "clone", "r2", "k", arrival=clock.now())
    [a] = one.run_inline().start
    [b] = two.run_inline().start
    assert 0 < a.token < b.token


def test_a_copy_of_a_job_that_finished_for_good_is_dropped(fleet, clock):
    one, two = fleet(2)
    one.submit("a", "clone", "linux", "k", arrival=clock.now())
    one.run_inline()
    one.finish("a", 1.0, final=True)
    one.run_inline()
    two.submit("a", "clone", "linux", "k", arrival=clock.now())  # a late copy of its message
    decision = two.run_inline()
    assert decision.start == []
    assert decision.drop == ["a"]
    assert "a" not in two.core


def test_a_copy_of_a_job_running_elsewhere_waits_until_that_worker_is_gone(fleet, clock, kind):
    one, two = fleet(2, lease=0.5)
    one.submit("a", "clone", "linux", "k", arrival=clock.now())
    assert started(one.run_inline()) == ["a"]
    # The first worker dies (it never calls again); the broker gives the message to the second.
    two.submit("a", "clone", "linux", "k", arrival=clock.now())
    assert started(two.run_inline()) == []
    assert two.observer.counts["stalled"] == 1

    def runs_once_the_lease_is_gone():
        if kind == "memory":
            clock.advance(0.25)
        else:
            clock.advance(1.0)  # the engine's own retry interval; the lease is Redis's time
        return started(two.run_inline()) == ["a"]

    wait_until(runs_once_the_lease_is_gone, 10, "the dead worker's job to be reclaimed")


def test_a_job_cancelled_while_its_admission_is_in_flight_is_released(fleet, clock, kind):
    (one,) = fleet(1)
    one.submit("a", "clone", "linux", "k", arrival=clock.now())
    decision = one.decide()
    assert decision.call is not None
    assert decision.call.kind == "admit"
    assert [a.uid for a in decision.call.admissions] == ["a"]
    assert one.cancel("a")  # revoked while the store decides
    result = one.apply(decision.call, decision.call.execute(one.store))
    assert result.start == []
    one.submit("b", "clone", "linux", "k", arrival=clock.now())
    assert started(one.run_inline()) == ["b"]  # the conflict was released with a


def test_hold_mode_admits_nothing_while_the_store_is_down_and_catches_up_after(fleet, clock):
    (engine,) = fleet(1)
    store = Cuttable(engine.store)
    engine.store = store
    engine.submit("a", "clone", "r1", "k", arrival=clock.now())
    assert started(engine.run_inline()) == ["a"]
    store.cut = True
    engine.finish("a", 2.0, final=True)  # finished during the outage: reported later
    engine.submit("b", "clone", "r2", "k", arrival=clock.now())
    assert started(engine.run_inline()) == []
    assert engine.mode is Mode.HOLD
    clock.advance(0.1)
    assert started(engine.run_inline()) == []  # still backing off: no call at all
    store.cut = False
    clock.advance(10.0)
    assert started(engine.run_inline()) == ["b"]
    assert engine.mode is Mode.SHARED
    assert store.store.estimate("clone", "r1", 1.0) == 0.3 * 2.0 + 0.7 * 1.0


def test_local_mode_runs_on_this_workers_share_and_never_a_conflicting_job(fleet, clock):
    one, two = fleet(2, outage="local")
    two.submit("warmup", "bg", None, "", arrival=clock.now())
    two.run_inline()  # two workers hold leases now
    store = Cuttable(one.store)
    one.store = store
    one.submit("w", "bg", None, "", arrival=clock.now())
    one.run_inline()
    assert one.workers == 2
    store.cut = True
    for i in range(3):
        one.submit(f"c{i}", "clone", None, "k", arrival=clock.now())  # no job_id: no conflict
    one.submit("x", "clone", "linux", "k", arrival=clock.now())  # a conflict: must wait
    got = started(one.run_inline())
    assert one.mode is Mode.LOCAL
    assert got == ["c0"]  # ceil(type cap 2 / 2 workers) = 1
    # When the store answers again, the job admitted locally is registered, then it goes on.
    store.cut = False
    clock.advance(10.0)
    later = started(one.run_inline())
    assert one.mode is Mode.SHARED
    assert one.observer.counts["registered"] == 1  # c0, which the store had never seen
    assert later == ["c1"]  # the fleet's type cap of 2: c0 and c1
    # x no longer waits for its conflict, only for the type cap.
    assert [r.value for r in one.core.status("x").blocked_by] == ["type_cap"]


@pytest.mark.parametrize("kind", ["redis"])  # an in-memory store never loses its state
def test_a_store_that_comes_back_empty_gets_our_running_jobs_back(fleet, clock, kind):
    (engine,) = fleet(1, lease=0.5)
    engine.submit("a", "clone", "linux", "k", arrival=clock.now())
    engine.submit("b", "clone", "other", "k", arrival=clock.now())
    assert started(engine.run_inline()) == ["a", "b"]
    redis_client = engine.store.client
    for key in engine.store.keys:
        redis_client.delete(key)  # Redis restarted without persistence
    engine.submit("c", "clone", "third", "k", arrival=clock.now())
    clock.advance(10.0)
    engine.run_inline()
    assert engine.observer.counts["registered"] == 2
    assert engine.store.heartbeat("w0", [], []).types == {"clone": 2}


def test_a_message_that_comes_back_while_its_admission_is_in_flight_takes_it_over(fleet, clock):
    (one,) = fleet(1)
    one.submit("a", "clone", "linux", "k", arrival=clock.now())
    decision = one.decide()
    assert one.cancel("a")  # its message was returned to the broker meanwhile...
    one.submit("a", "clone", "linux", "k", arrival=clock.now())  # ...and delivered again
    result = one.apply(decision.call, decision.call.execute(one.store))
    assert started(result) == ["a"]


# -- jobs admitted ahead of a free slot (the gate's reserve) -----------------------------------


def test_a_reserved_job_keeps_its_admission_while_nothing_ranks_before_it(fleet, clock):
    [one] = fleet(1, capacity=2)
    one.submit("a0", "clone", "r0", "A", arrival=clock.now())
    one.submit("a1", "clone", "r1", "A", arrival=clock.now())
    assert started(one.run_inline()) == ["a0", "a1"]  # a1 is reserved by the caller
    calls = one.observer.counts["calls"]
    one.submit("a2", "clone", "r2", "A", arrival=clock.now())  # same client, later: behind
    assert one.reconsider(["a1"]) == []
    assert one.run_inline().start == []
    assert one.observer.counts["calls"] == calls  # nothing to tell the store
    assert one.store.accumulated_cost("A") == 2.0


def test_a_newcomer_that_ranks_first_takes_the_reserved_admission_in_one_call(fleet, clock):
    [one] = fleet(1, capacity=2)
    for i in range(3):
        one.submit(f"a{i}", "clone", f"r{i}", "A", arrival=clock.now())
    assert started(one.run_inline()) == ["a0", "a1"]  # a0 runs, a1 is reserved
    calls = one.observer.counts["calls"]
    one.submit("b0", "clone", "x", "B", arrival=clock.now())  # B has used nothing
    assert one.reconsider(["a1"]) == ["a1"]
    # One call gives a1 back (its charge refunded) and admits in the new order.
    assert started(one.run_inline()) == ["b0"]
    assert one.observer.counts["calls"] == calls + 1
    assert one.observer.counts["given_back"] == 1
    assert one.store.accumulated_cost("A") == 1.0
    assert one.core.status("a1").place is not None  # pending again, first of A's
    one.finish("a0", 1.0, final=True)
    assert started(one.run_inline()) == ["a1"]


def test_a_newcomer_takes_back_only_the_reserved_admissions_it_ranks_before(fleet, clock):
    [one] = fleet(1, capacity=4)
    for i, key in enumerate("AABC"):
        one.submit(f"j{i}", "fetch", f"r{i}", key, arrival=clock.now())
    assert started(one.run_inline()) == ["j0", "j2", "j3", "j1"]  # A, B, C, then A again
    # j0 runs; j2, j3, j1 wait for a slot. D has used nothing, so it ranks before A's second
    # job (A has used 1) but after B's and C's (tied at 1 with D's charge-to-be, and earlier).
    one.finish("j0", 1.0, final=True)
    one.submit("d0", "fetch", "x", "D", arrival=clock.now())
    assert one.reconsider(["j2", "j3", "j1"]) == ["j1"]
    assert one.observer.counts["given_back"] == 1
    assert started(one.run_inline()) == ["d0", "j1"]  # the free slot and j1's, new order


def test_alone_a_newcomer_takes_the_reserved_place_in_the_core():
    clock = SimClock()
    core = Scheduler(SchedulerConfig(2, lifecycle=NEVER), clock, TYPES)
    engine = Engine(core)
    for i in range(3):
        engine.submit(f"a{i}", "clone", f"r{i}", "A", arrival=0)
    assert started(engine.decide()) == ["a0", "a1"]
    engine.submit("b0", "clone", "x", "B", arrival=0)
    assert engine.reconsider(["a1"]) == ["a1"]
    assert started(engine.decide()) == ["b0"]
    assert core.accumulated_cost("A") == 1.0


def test_no_reconsidering_while_a_call_is_in_flight(fleet, clock):
    [one] = fleet(1, capacity=2)
    one.submit("a0", "clone", "r0", "A", arrival=clock.now())
    one.submit("a1", "clone", "r1", "A", arrival=clock.now())
    assert started(one.run_inline()) == ["a0", "a1"]
    one.submit("b0", "clone", "x", "B", arrival=clock.now())
    clock.advance(one.beat_interval)
    call = one.decide().call
    assert call is not None
    assert call.kind == "beat"
    assert one.reconsider(["a1"]) == []  # its answer may change the picture: ask after it
    one.apply(call, call.execute(one.store))
    assert one.reconsider(["a1"]) == ["a1"]


# -- a worker paused past its lease (SIGSTOP, a long GC, a VM pause) -------------------------


def paused_past_the_lease(one, two, clock, kind):
    """``one`` is paused: its lease lapses (by the simulated clock in memory, Redis's own
    time otherwise), and ``two`` reclaims its jobs and is admitted b, a clone of linux."""
    two.submit("b", "clone", "linux", "B", arrival=clock.now())

    def b_started():
        clock.advance(0.25)
        return started(two.run_inline()) == ["b"]

    every = 0 if kind == "memory" else 0.1  # Redis's lease runs on its own clock
    wait_until(b_started, 10, "the other worker's clone to start", every=every)


def test_a_reserved_job_of_a_worker_paused_past_its_lease_is_given_back_not_started(
    fleet, clock, kind
):
    # Given a worker running a0 with a1, a clone of linux, admitted and reserved,
    one, two = fleet(2, capacity=2, lease=0.5)
    one.submit("a0", "fetch", "r0", "A", arrival=clock.now())
    one.submit("a1", "clone", "linux", "A", arrival=clock.now())
    assert started(one.run_inline()) == ["a0", "a1"]
    assert one.vet(["a1"]) == (["a1"], [])  # its lease holds: a1 may start
    # when it is paused past its lease and another worker is admitted a clone of linux,
    paused_past_the_lease(one, two, clock, kind)
    # then a1 does not start: it is given back, and refused while b holds linux,
    assert one.vet(["a1"]) == ([], ["a1"])
    assert one.observer.counts["given_back"] == 1
    assert started(one.run_inline()) == []
    assert [r.value for r in one.core.status("a1").blocked_by] == ["conflict"]
    # and it starts once b ends.
    two.finish("b", 0.1, final=True)
    two.run_inline()

    def a1_started():
        clock.advance(1.0)
        return "a1" in started(one.run_inline())

    wait_until(a1_started, 10, "a1 to start", every=0)


def test_an_admission_read_a_lease_after_its_call_was_sent_is_given_back_not_started(
    fleet, clock, kind
):
    # Given a worker whose admission of a, a clone of linux, the store has made,
    one, two = fleet(2, lease=0.5)
    one.submit("a", "clone", "linux", "A", arrival=clock.now())
    call = one.decide().call
    assert call is not None
    assert call.kind == "admit"
    reply = call.execute(one.store)
    # when the worker is paused before it reads the reply, past its lease, and another
    # worker is admitted a clone of linux meanwhile,
    paused_past_the_lease(one, two, clock, kind)
    # then a does not start when the reply is read: it is given back, and asked for again,
    assert started(one.apply(call, reply)) == []
    assert one.observer.counts["given_back"] == 1
    assert started(one.run_inline()) == []
    assert [r.value for r in one.core.status("a").blocked_by] == ["conflict"]
    # and it starts once b ends.
    two.finish("b", 0.1, final=True)
    two.run_inline()

    def a_started():
        clock.advance(1.0)
        return "a" in started(one.run_inline())

    wait_until(a_started, 10, "a to start", every=0)


def test_a_reserved_job_waits_while_a_call_is_in_flight_and_the_lease_may_have_lapsed(fleet, clock):
    [one] = fleet(1, capacity=2, lease=0.5)
    one.submit("a0", "fetch", "r0", "A", arrival=clock.now())
    one.submit("a1", "clone", "linux", "A", arrival=clock.now())
    assert started(one.run_inline()) == ["a0", "a1"]
    clock.advance(1.0)
    call = one.decide().call
    assert call is not None  # a beat, sent after the pause
    assert one.vet(["a1"]) == ([], [])  # neither started nor given back: it waits
    one.apply(call, call.execute(one.store))
    assert one.vet(["a1"]) == ([], ["a1"])  # the lease had lapsed before that beat


def test_a_job_the_store_counts_after_its_release_was_lost_is_released(fleet, clock):
    # Given a worker running a, and the store counting one more job under its name: one that
    # ended, whose release a failover lost (written here straight into the store),
    [one] = fleet(1)
    one.submit("a", "clone", "linux", "k", arrival=clock.now())
    assert started(one.run_inline()) == ["a"]
    [ghost] = one.store.admit(one.worker, [ask("ghost", job_id="gone")]).grants
    # so b waits: a and the ghost fill the type cap of 2,
    one.submit("b", "clone", "git", "k", arrival=clock.now())
    assert started(one.run_inline()) == []
    assert one.observer.counts["refused"] == 1

    # when the worker's heartbeats go on,
    def b_started():
        clock.advance(1.0)
        return "b" in started(one.run_inline())

    wait_until(b_started, 5, "b to start", every=0)
    # then it notices, tells the store all it has, and the store releases the ghost.
    assert one.observer.counts["released"] == 1
    assert not one.store.finish(one.worker, [Done("ghost", ghost.token, None)])[0].applied
    view = one.store.heartbeat(one.worker, [], [])
    assert view.mine == 2  # a and b
    assert view.types == {"clone": 2}


def test_a_steady_stream_of_admissions_does_not_hold_back_the_check_for_lost_jobs(fleet, clock):
    # Given a worker whose every decision has a job to admit and one to report finished (as a
    # busy worker's loop has, call after call), and a ghost job in the store under its name,
    [one] = fleet(1)
    [ghost] = one.store.admit(one.worker, [ask("ghost", job_id="gone")]).grants
    kinds = []
    running = []
    for i in range(40):
        one.submit(f"j{i}", "fetch", f"r{i}", "k", arrival=clock.now())
        if running:
            one.finish(running.pop(0), 0.01, final=True)
        call = one.decide().call
        assert call is not None, kinds
        kinds.append(call.kind)
        running += started(one.apply(call, call.execute(one.store)))
        clock.advance(0.25)
    # then a heartbeat still comes within two of its periods, finds the ghost, and the
    # registration that follows releases it.
    assert "beat" in kinds[: int(2 * one.beat_interval / 0.25) + 2]
    assert one.observer.counts["released"] == 1
    assert not one.store.finish(one.worker, [Done("ghost", ghost.token, None)])[0].applied


class Told(Observer):
    """Records the events the engine tells."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def store_call(self, kind, seconds, ok):
        self.events.append(("store_call", kind, seconds, ok))

    def decided(self, seconds, admitted):
        self.events.append(("decided", seconds, admitted))

    def blocked(self, job_type, priority, reason):
        self.events.append(("blocked", job_type, priority, reason))

    def finished(self, job_type, priority, elapsed):
        self.events.append(("finished", job_type, priority, elapsed))

    def outage(self, mode):
        self.events.append(("outage", mode))

    def recovered(self):
        self.events.append(("recovered",))

    def lease_lost(self):
        self.events.append(("lease_lost",))

    def registered(self, n):
        self.events.append(("registered", n))

    def named(self, name):
        return [e for e in self.events if e[0] == name]


class SlowStore(Cuttable):
    """Each call takes ``seconds`` of the test's clock."""

    def __init__(self, store, clock, seconds):
        super().__init__(store)
        self.clock = clock
        self.seconds = seconds

    def __getattr__(self, name):
        attr = super().__getattr__(name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.clock.advance(self.seconds)
            return attr(*args, **kwargs)

        return call


def test_the_engine_tells_its_observer_each_store_call_refusal_and_end(fleet, clock):
    told = Told()
    one, two = fleet(2, observer=told)
    two.store = SlowStore(two.store, clock, 0.004)
    for i in range(2):
        one.submit(f"a{i}", "clone", f"r{i}", "k", arrival=clock.now())
    one.run_inline()  # the type cap of 2 is full, fleet-wide
    told.events.clear()
    two.submit("b", "clone", "x", "k", arrival=clock.now())
    assert started(two.run_inline()) == []
    assert told.named("blocked") == [("blocked", "clone", 8, "type_cap")]
    assert [admitted for _, _, admitted in told.named("decided")][:1] == [1]  # b, proposed
    calls = told.named("store_call")
    assert calls[0][1] == "admit"
    assert all(c[2] == pytest.approx(0.004) and c[3] for c in calls)  # timed by its clock
    told.events.clear()
    one.finish("a0", 1.5, final=True)
    one.finish("a1", None)
    assert told.events == [("finished", "clone", 8, 1.5), ("finished", "clone", 8, None)]


def test_the_engine_tells_an_outage_a_recovery_and_a_lost_lease(fleet, clock):
    told = Told()
    (engine,) = fleet(1, observer=told)
    store = Cuttable(engine.store)
    engine.store = store
    engine.submit("a", "clone", "r1", "k", arrival=clock.now())
    [a] = engine.run_inline().start
    store.cut = True
    engine.submit("b", "clone", "r2", "k", arrival=clock.now())
    engine.run_inline()
    assert told.named("outage") == [("outage", "hold")]
    assert told.named("store_call")[-1][1:] == ("admit", 0.0, False)
    store.cut = False
    # While it was away, the store lost this worker's running job (its lease expired).
    store.store.finish(engine.worker, [Done("a", a.token, None)])
    clock.advance(10.0)
    engine.run_inline()
    assert told.named("recovered") == [("recovered",)]
    assert told.named("lease_lost") == [("lease_lost",)]
    assert told.named("registered") == [("registered", 1)]
