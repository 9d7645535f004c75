"""Spills on the gate alone (gate_world.py): when held work blocks the queue (``fair_max_held``
held, a slot free that none of them can take), the gate returns the lowest-ranked tenth of what
it holds to the broker, at most every ``fair_spill_interval``; held work that keeps every slot
busy is never returned; a paused job goes back only if nothing else can, once per policies
version.

That a returned message really comes back from each broker and runs is
tests/integration/test_spill.py's.
"""

from __future__ import annotations

from typing import Any

from gate_world import EPOCH, World

from celery_fair.policies import FleetPolicies
from celery_fair.worker.headers import PAUSED_SPILL, REPUBLISHED, SUBMITTED

INTERVAL = 0.5  # fair_spill_interval here (a sum of binary fractions: exact on the clock)


def returned(w: World) -> list[str]:
    """The task ids of the messages the gate published back to the broker, in order."""
    return [copy["headers"]["id"] for copy in w.app.published]


def copy_of(w: World, task_id: str) -> dict[str, Any]:
    [copy] = [c for c in w.app.published if c["headers"]["id"] == task_id]
    return copy


def test_held_work_that_blocks_a_free_slot_returns_its_lowest_ranked_tenth() -> None:
    # Given two processes, one running a long job on linux, and twenty more jobs on linux held
    # (fair_max_held of them), each published a second before the one delivered before it (so
    # the last delivered ranks first),
    w = World(slots=2, fair_max_held=20, fair_spill_interval=INTERVAL)
    first = w.deliver("L0", key="k", job_id="linux")
    held = [
        w.deliver(f"L{i}", key="k", job_id="linux", headers={SUBMITTED: EPOCH - i})
        for i in range(1, 21)
    ]
    assert w.pool.ids() == ["L0"]
    assert w.gate.job_status("L1")["place"] == 20
    # when the second process stays free because every held job waits for linux,
    w.gate.sweep()
    # then the gate returns the lowest-ranked tenth (two) to the queue they came by, each
    # keeping its place (its submission time) and counting its trip, then acks them;
    assert returned(w) == ["L1", "L2"]
    for i in (1, 2):
        copy = copy_of(w, f"L{i}")
        assert copy["routing_key"] == "celery"
        assert copy["headers"][SUBMITTED] == EPOCH - i
        assert copy["headers"][REPUBLISHED] == 1
        assert held[i - 1].acknowledged
        assert f"L{i}" not in w.gate.held
    assert not any(r.acknowledged for r in held[2:])
    assert w.stats()["fair-spilled"] == 2
    # at most once every fair_spill_interval,
    w.deliver("L21", key="k", job_id="linux")
    w.deliver("L22", key="k", job_id="linux")
    w.clock.advance(INTERVAL / 2)
    w.gate.sweep()
    assert len(w.app.published) == 2
    w.clock.advance(INTERVAL / 2)
    w.gate.sweep()
    assert returned(w)[2:] == ["L22", "L21"]
    # so that a job behind them in the broker can be seen: it runs while the long job runs;
    w.deliver("free", key="k", job_id="other")
    assert w.pool.ids() == ["L0", "free"]
    # and the returned ones, delivered again, take their places back: every job runs once.
    for copy in list(w.app.published):
        w.redeliver(copy)
    assert w.gate.job_status("L2")["place"] == 19
    w.pool.finish(first)
    while w.pool.running():
        w.pool.finish(w.pool.running()[0])
    assert sorted(w.pool.ids()) == sorted(["free", *(f"L{i}" for i in range(23))])
    assert w.pool.ids()[2:4] == ["L20", "L19"]  # in fair order


def test_held_work_that_keeps_every_slot_busy_is_never_spilled() -> None:
    # Given one process and fair_max_held jobs held behind it, over three keys,
    w = World(slots=1, fair_max_held=4, fair_spill_interval=INTERVAL)
    for i in range(5):
        w.deliver(f"j{i}", key=f"k{i % 3}", job_id=f"r{i}")
    # when thirty jobs run one after another, the window taking one more in as each ends,
    # and the gate sweeps between them,
    for i in range(5, 30):
        w.gate.sweep()
        w.clock.advance(INTERVAL)
        w.gate.sweep()
        w.pool.finish(w.pool.running()[0])
        w.deliver(f"j{i}", key=f"k{i % 3}", job_id=f"r{i}")
        assert len(w.gate.held) == 4
    while w.pool.running():
        w.pool.finish(w.pool.running()[0])
    # then nothing was returned, and every job ran once.
    assert not w.app.published
    assert w.stats()["fair-spilled"] == 0
    assert sorted(w.pool.ids()) == sorted(f"j{i}" for i in range(30))


def test_a_held_message_with_a_bad_republished_count_is_still_spilled() -> None:
    # Given the blocked backlog above, each message carrying a fair_republished header that is
    # not an int (a producer's, or a hand-made copy's),
    w = World(slots=2, fair_max_held=4, fair_spill_interval=INTERVAL)
    w.deliver("L0", key="k", job_id="linux", headers={REPUBLISHED: "x"})
    held = [
        w.deliver(f"L{i}", key="k", job_id="linux", headers={REPUBLISHED: "x"}) for i in range(1, 5)
    ]
    # when held work blocks the free slot, the bad count is taken as none: the spilled
    # message goes back counted from 1, and its original is acked;
    w.gate.sweep()
    assert returned(w) == ["L4"]
    assert copy_of(w, "L4")["headers"][REPUBLISHED] == 1
    assert held[-1].acknowledged
    assert w.stats()["fair-spilled"] == 1
    # delivered again and returned again, it counts on from there.
    w.redeliver(w.app.published[0])
    w.clock.advance(INTERVAL)
    w.gate.sweep()
    assert returned(w) == ["L4", "L4"]
    assert w.app.published[1]["headers"][REPUBLISHED] == 2


def test_a_paused_job_goes_back_only_if_nothing_else_can() -> None:
    # Given two processes, one running a job on linux, and held behind it another job on linux
    # (waiting for the conflict) and three jobs of tenant acme, paused fleet-wide,
    w = World(slots=2, fair_max_held=4, fair_spill_interval=INTERVAL)
    FleetPolicies(store=w.store).pause_key("acme")
    w.deliver("L0", key="bob", job_id="linux")
    for i in range(3):
        w.deliver(f"acme{i}", key="acme", job_id=f"a{i}")
    w.deliver("L1", key="bob", job_id="linux")
    assert w.gate.job_status("acme2")["blocked_by"] == ["paused"]
    # when held work blocks the free slot, then the job that is not paused goes back,
    w.gate.sweep()
    assert returned(w) == ["L1"]
    assert PAUSED_SPILL not in copy_of(w, "L1")["headers"]
    # and again each time it comes back while the paused jobs stay.
    w.redeliver(w.app.published[0])
    w.clock.advance(INTERVAL)
    w.gate.sweep()
    assert returned(w) == ["L1", "L1"]
    assert sorted(w.gate.held) == ["acme0", "acme1", "acme2"]


def test_paused_jobs_go_back_once_per_policies_version_not_round_and_round() -> None:
    # Given one free process and fair_max_held jobs of tenant acme held, acme paused,
    w = World(slots=1, fair_max_held=4, fair_spill_interval=INTERVAL)
    policies = FleetPolicies(store=w.store)
    policies.pause_key("acme")
    for i in range(4):
        w.deliver(f"acme{i}", key="acme", job_id=f"a{i}")
    version = w.stats()["fair-policies-version"]
    assert w.pool.ids() == []
    # when the gate sweeps, each returned job delivered straight back,
    for _ in range(6):
        w.gate.sweep()
        if len(w.gate.held) < 4:
            w.redeliver(w.app.published[-1])
        w.clock.advance(INTERVAL)
    # then each went back once, the lowest-ranked first, marked with the policies' version,
    assert returned(w) == ["acme3", "acme2", "acme1", "acme0"]
    assert {c["headers"][PAUSED_SPILL] for c in w.app.published} == {version}
    assert w.stats()["fair-spilled"] == 4
    # and none goes back again while that version holds (it would only come back);
    assert len(w.gate.held) == 4
    # once the policies change (acme still paused), they may go back once more.
    policies.pause_key("other")
    w.clock.advance(2.0)  # past the engine's next look at the store (a beat a second)
    w.gate.sweep()
    assert w.stats()["fair-policies-version"] == version + 1
    assert len(w.app.published) == 5
    assert w.app.published[4]["headers"][PAUSED_SPILL] == version + 1
